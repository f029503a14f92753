"""pyproject.toml declares what the code imports: every third-party module imported under ``lib/`` (and by the
DAG factory) comes from a distribution listed in ``dependencies`` or an extra, at a range holding the pin."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# where the code's imports must be declared: the library in the core dependencies or an extra, the DAG
# factory in the core dependencies or the airflow extra
SOURCES = {"lib": [*EXTRAS], "airflow_dags": ["airflow"]}


def declared(*extras: str) -> dict[str, Requirement]:
    requirements = [Requirement(r) for r in PROJECT["dependencies"]]
    requirements += [Requirement(r) for extra in extras for r in EXTRAS[extra]]
    return {canonicalize_name(r.name): r for r in requirements}


def third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level module → files importing it, for every absolute import (function-level ones included)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "rmqlake" and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_scan_finds_the_known_imports():
    assert {"pyspark", "pyarrow", "msgspec", "croniter", "jinja2", "great_expectations"} <= set(
        third_party_imports(REPO / "lib")
    )


@pytest.mark.parametrize("folder", list(SOURCES))
def test_every_third_party_import_is_declared(folder):
    allowed = declared(*SOURCES[folder])
    distributions = packages_distributions()
    missing = {}
    for module, files in third_party_imports(REPO / folder).items():
        providers = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not providers & set(allowed):
            missing[module] = (sorted(providers), sorted(files))
    assert missing == {}, f"imported but not declared in pyproject.toml (module: (distributions, files)): {missing}"


def pins() -> dict[str, Version]:
    found = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[canonicalize_name(re.sub(r"\[.*\]", "", name))] = Version(version)
    return found


def test_declared_ranges_hold_the_pinned_versions():
    pinned = pins()
    constraints = {
        canonicalize_name(name): Version(version)
        for name, version in (
            line.split("==") for line in (REPO / "constraints.txt").read_text().split() if "==" in line
        )
    }
    for name, requirement in declared(*EXTRAS).items():
        version = pinned.get(name) or constraints[name]
        assert requirement.specifier.contains(version), f"{requirement} does not allow the pinned {name} {version}"
