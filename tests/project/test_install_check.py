"""The install checks that torch and torchvision import together and names the fix; `make
check` is the documented quick subset and `make test` stays the whole suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check(tmp_path: Path, broken: bool) -> subprocess.CompletedProcess:
    """``python -m cfl.install_check``, with a torchvision that fails to import as a CUDA build beside a CPU torch
    does (``broken``)."""
    path = [str(ROOT)]
    if broken:
        fake = tmp_path / "fake" / "torchvision"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
        path.insert(0, str(fake.parent))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-m", "cfl.install_check"], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_torchvision_that_does_not_import_fails_the_install_naming_the_fix(tmp_path):
    done = check(tmp_path, broken=True)
    assert done.returncode == 1, done.stderr
    assert "torchvision::nms does not exist" in done.stderr
    assert "do not import together" in done.stderr and "--force-reinstall torch torchvision" in done.stderr
    assert "--index-url https://download.pytorch.org/whl/cpu" in done.stderr


def test_torch_and_torchvision_that_import_pass(tmp_path):
    done = check(tmp_path, broken=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    block = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert block, target
    return [line.strip() for line in block.group(1).splitlines()]


def test_make_install_runs_the_check_and_make_check_leaves_out_the_slow_tests():
    assert any("-m cfl.install_check" in line for line in recipe("$(VENV)/.installed"))
    assert recipe("test")[-1] == "$(BIN)/python -m pytest"  # the whole suite: the CI command
    assert recipe("check")[-1] == '$(BIN)/python -m pytest -m "not slow"'
    readme = (ROOT / "README.md").read_text()
    assert "make check" in readme and re.search(r"make test.*\d+ min", readme, re.DOTALL)
