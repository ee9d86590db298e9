"""Run files get the user's normal permissions (0o666 less the umask), not the 0600 of a temporary file."""

import os
import stat

import pytest

from cfl.app.single_run import execute
from cfl.report.files import atomic_write_bytes, atomic_write_json, current_umask
from tests.conftest import tiny_config


@pytest.fixture
def umask():
    """Set a umask for the test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o002, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    atomic_write_bytes(tmp_path / "b.bin", b"x")
    assert mode(tmp_path / "a.json") == mode(tmp_path / "b.bin") == 0o666 & ~mask


def test_every_file_of_a_run_is_readable_by_the_group(tmp_path, umask):
    umask(0o002)
    out = tmp_path / "run"
    execute(tiny_config(rounds_per_task=1), out, quiet=True)
    modes = {p.name: oct(mode(p)) for p in out.iterdir()}
    assert {"results.json", "config.yaml", "metrics.jsonl", "checkpoint.pt", "acc_matrix.png"} <= modes.keys()
    assert modes == dict.fromkeys(modes, oct(0o664))
