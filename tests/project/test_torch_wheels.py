"""``make install`` installs torch and torchvision in one pip call from one index (cfl/torch_wheels.py chooses
it: PyTorch's CPU index where it answers, else pip's own with a note), before the package, whose install keeps
them; the README's advice without make does the same."""

from __future__ import annotations

import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cfl.torch_wheels import index_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_index() -> Iterator[str]:
    """A local HTTP server that answers ``/torch/``: an index that is reachable."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/torch/" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:  # noqa: ARG002 - quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port_index() -> str:
    """An index on a local port that nothing listens on: refused at once, as an unreachable index."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_reachable_cpu_index_is_chosen_without_a_gpu(local_index):
    assert index_args({}, gpu=False, cpu_index=local_index) == (["--index-url", local_index], None)


def test_an_unreachable_cpu_index_falls_back_to_pips_index_and_says_so():
    args, note = index_args({}, gpu=False, cpu_index=closed_port_index())
    assert args == [] and "not reachable" in note and "3 GB of CUDA libraries" in note and "TORCH_INDEX" in note


def test_a_gpu_machine_and_the_users_choice_take_no_probe():
    unreachable = closed_port_index()
    assert index_args({}, gpu=True, cpu_index=unreachable) == ([], None)
    assert index_args({"TORCH_INDEX": "https://example.org/whl"}, gpu=False, cpu_index=unreachable) == (
        ["--index-url", "https://example.org/whl"], None)
    assert index_args({"TORCH_INDEX": "default"}, gpu=False, cpu_index=unreachable) == ([], None)


def make_dry_run() -> list[str]:
    """``make -n install`` on a venv that does not exist: the commands make would run."""
    done = subprocess.run(["make", "-n", "install", "VENV=/nonexistent/venv"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_installs_torch_and_torchvision_in_one_call_before_the_package():
    lines = make_dry_run()
    pip = [i for i, line in enumerate(lines) if "-m pip install" in line]
    torch_line = [i for i in pip if re.search(r"pip install --quiet torch torchvision \$\(.*-m cfl\.torch_wheels\)",
                                               lines[i])]
    package_line = [i for i in pip if '-e ".[' in lines[i]]
    assert len(torch_line) == 1 and len(package_line) == 1 and torch_line[0] < package_line[0], lines
    assert "--index-url" not in lines[package_line[0]]  # the package's install keeps the torch installed before


def test_the_readme_without_make_installs_torch_and_torchvision_in_one_call_first():
    readme = (ROOT / "README.md").read_text()
    assert "download.pytorch.org/whl/cpu" in readme and "TORCH_INDEX" in readme
    line = re.search(r"`python3 -m venv \.venv && (.+?)`", readme)
    assert line, "the README's install without make"
    steps = line.group(1).split(" && ")
    assert steps[0].startswith(".venv/bin/pip install torch torchvision"), steps
    assert any('pip install -e ".[' in s for s in steps[1:]), steps
