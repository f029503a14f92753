"""Table access: read, stage, commit, roll forward. Hides which Delta engine commits.

Only this package imports ``deltalake``; transforms never see it.
"""

from rmqlake.lake.lake import Lake, LakeRun, run_with_retries
from rmqlake.lake.tables import TABLES, TableSpec, table_spec

__all__ = ["TABLES", "Lake", "LakeRun", "TableSpec", "run_with_retries", "table_spec"]
