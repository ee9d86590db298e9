"""Every third-party package that cfl/ imports is declared in pyproject.toml (dependencies or an extra)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def normalise(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level(package: Path) -> set[str]:
    """Top-level names of the absolute imports in every module of ``package`` (lazy ones included)."""
    names: set[str] = set()
    for file in package.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {package.name}


def declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}


def test_every_imported_package_is_declared() -> None:
    owners, wanted = packages_distributions(), declared()
    imported = imported_top_level(ROOT / "cfl")
    assert {"torch", "PIL", "avalanche"} <= imported  # the scan sees module-level and function-level imports
    missing = {name: owners.get(name) for name in imported
               if not any(normalise(dist) in wanted for dist in owners.get(name, []))}
    assert not missing, f"imported by cfl/ but not declared in pyproject.toml (module: distributions): {missing}"
