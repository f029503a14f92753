"""Airflow reads its home and settings when it is first imported: point them at a fresh folder first.

Never the user's ~/airflow; the metadata DB (sqlite) is created per test session
by the fixture that runs DAGs.
"""

from __future__ import annotations

import os
import tempfile

from tests.conftest import REPO

os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="rmqlake-airflow-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "airflow_dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
