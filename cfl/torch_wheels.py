"""``python -m cfl.torch_wheels``: the pip arguments that install torch and torchvision together, from one index.

``make install`` runs ``pip install torch torchvision $(python -m cfl.torch_wheels)`` before the package itself,
so that both come from one resolver call and one index (two calls from two indexes left a CPU torch beside a
CUDA torchvision, which do not import together). The index, printed as pip arguments on stdout:

- ``TORCH_INDEX`` set (``make TORCH_INDEX=URL``): that index, ``--index-url URL``; ``TORCH_INDEX=default``:
  pip's configured index (PyPI);
- a machine with an NVIDIA driver: pip's configured index (PyPI's default wheels are the CUDA builds);
- otherwise PyTorch's CPU wheel index where it answers within a few seconds (CPU-only builds, no 3 GB of CUDA
  libraries), else pip's configured index with a note on stderr saying so and what it costs.

Only the standard library: it runs before torch is installed.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: the page the probe asks for: the CPU index's torch listing
PROBE_PAGE = "/torch/"
PROBE_SECONDS = 5.0


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver (a GPU that the default CUDA wheels can use)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def reachable(index: str, seconds: float = PROBE_SECONDS) -> bool:
    """Whether ``index`` answers its torch page within ``seconds``."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + PROBE_PAGE, timeout=seconds) as response:
            return response.status == 200
    except Exception:  # noqa: BLE001 - any failure (no DNS, refused, timeout, HTTP error) means not reachable
        return False


def index_args(env: dict[str, str], gpu: bool, cpu_index: str = CPU_INDEX) -> tuple[list[str], str | None]:
    """The pip arguments that choose the index, and the note to print (None: nothing to say)."""
    chosen = env.get("TORCH_INDEX", "").strip()
    if chosen == "default":
        return [], None
    if chosen:
        return ["--index-url", chosen], None
    if gpu:
        return [], None
    if reachable(cpu_index):
        return ["--index-url", cpu_index], None
    return [], (f"note: PyTorch's CPU wheel index ({cpu_index}) is not reachable: torch and torchvision come "
                "from pip's configured index (PyPI), whose Linux wheels bring about 3 GB of CUDA libraries a "
                "CPU never uses; both still come from one index and import together. To choose another index: "
                "make TORCH_INDEX=URL")


def main() -> int:
    args, note = index_args(dict(os.environ), has_nvidia_driver())
    if note:
        print(note, file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
