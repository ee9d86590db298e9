"""Docs that are generated from code must match it, and no shipped file cites a path users do not have."""

import re
import subprocess
from pathlib import Path

import pytest

from cfl.app.cli import config_reference

ROOT = Path(__file__).resolve().parents[2]
#: paths of the project's private notes (specification, design, papers), which are not in the repository
PRIVATE = re.compile(r"\.\./shared|shared/(spec|design|papers)|spec/(setups|methods)\.md|design/architecture\.md")


def test_configuration_reference_is_up_to_date():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == config_reference(), "regenerate: cfl config-reference > docs/configuration.md"


def test_no_tracked_file_outside_tests_cites_a_private_path():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.strip()}): the tracked files are unknown")
    cited = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if name.startswith("tests/") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary (figures)
        cited += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in PRIVATE.finditer(text)]
    assert not cited, "quote the figure instead of citing a path users do not have:\n" + "\n".join(cited)


def test_the_private_path_pattern_finds_what_it_is_for():
    for text in ("see ../shared/spec/setups.md", "spec/setups.md", "(spec/methods.md)", "shared/design/x.md"):
        assert PRIVATE.search(text), text
    for text in ("docs/methods/fot.md", "configs/evidence/pfmnist-small.yaml", "the spec's", "shared head"):
        assert not PRIVATE.search(text), text
