"""``make package``: the zip for ``--py-files`` holds every module of the library and nothing else; the wheel
holds the same modules and declares the dependencies executors need."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # STAMP= : build with this virtualenv as it is (the target would otherwise (re)install it first)
    subprocess.run(
        ["make", "-s", "package", "STAMP=", f"BIN={Path(sys.executable).parent}", f"DIST={out}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def library_modules() -> set[str]:
    return {str(p.relative_to(REPO / "lib")) for p in (REPO / "lib" / "rmqlake").rglob("*.py")}


def test_the_zip_holds_every_library_module_and_nothing_else(dist):
    names = set(zipfile.ZipFile(dist / "rmqlake.zip").namelist())
    assert names == library_modules()
    assert "rmqlake/store/export.py" in names and not any(n.startswith("tests/") for n in names)


def test_the_wheel_holds_the_same_modules_and_declares_the_dependencies(dist):
    (wheel,) = dist.glob("rmqlake-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist")
    assert {n for n in names if n.startswith("rmqlake/")} == library_modules()
    assert not any(n.startswith(("tests/", "jobs/", "bench/")) for n in names)
    assert any(r.startswith("msgspec") for r in requires)  # compiled: executors install it, no zip carries it
    assert any(r.startswith("apache-airflow") and 'extra == "airflow"' in r for r in requires)
