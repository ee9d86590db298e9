"""The distribution's name is not the one PyPI gives another project (``cfl``, Causal Feature Learning): every
install line names the checkout's extras or ``cfl-bench``, never ``cfl[...]``; the import name and the command
stay ``cfl``."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from cfl.distribution import DISTRIBUTION, TAKEN_NAME, extra_install

ROOT = Path(__file__).resolve().parents[2]
#: an install of the taken name: ``pip install cfl``, ``pip install 'cfl[ray]'``, or the bare ``cfl[extra]``
TAKEN_INSTALL = re.compile(r"pip install ['\"]?cfl(?:\[|['\"\s]|$)|(?<![\w.-])cfl\[\w")


def test_the_distribution_is_cfl_bench_importing_as_cfl_with_the_cfl_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "cfl-bench" != TAKEN_NAME
    assert project["scripts"] == {"cfl": "cfl.app.cli:main"}
    assert (ROOT / "cfl" / "__init__.py").exists()


def test_no_install_line_names_the_taken_name() -> None:
    files = [ROOT / "README.md", ROOT / "Makefile", *ROOT.glob("docs/**/*.md"), *ROOT.glob("cfl/**/*.py"),
             *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path in files if path != Path(__file__)
             for i, line in enumerate(path.read_text().splitlines(), 1) if TAKEN_INSTALL.search(line)]
    assert not found, found


def test_the_extras_install_line_is_the_checkouts_and_names_an_extra_that_exists() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("ray", "pretrained"):
        assert extra in extras and extra_install(extra) == f'pip install -e ".[{extra}]" in the cfl-bench checkout'


def test_ci_builds_the_package_and_checks_it_with_twine_from_the_dev_extra() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "-m build --outdir" in ci and "-m twine check --strict" in ci
    assert ci.index("make test") < ci.index("-m build")  # the dev extra is installed by then
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert {re.split(r"[<>=]", d)[0] for d in dev} >= {"build", "twine"}
