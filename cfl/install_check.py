"""``python -m cfl.install_check``: torch and torchvision import together, or the fix is printed and the exit
code is 1 (``make install`` runs it). A CPU-only torch beside a CUDA torchvision (which two pip calls from two
indexes can leave; ``make install`` installs both in one call, :mod:`cfl.torch_wheels`) fails only when
torchvision is imported: in the test suite as 26 Avalanche failures, in a run of a torchvision stream as a traceback."""

from __future__ import annotations

import sys
from importlib import metadata


def installed(package: str) -> str:
    """The package's installed version (``2.3.0+cpu``), or ``not installed``."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def problem() -> str | None:
    """Why torch and torchvision do not import together, with the fix; None when they do."""
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as err:  # noqa: BLE001 (any failure of the import is the finding)
        torch_v, vision_v = installed("torch"), installed("torchvision")
        build = torch_v.partition("+")[2] or "the default (CUDA on Linux)"
        return (f"torch {torch_v} and torchvision {vision_v} do not import together ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}; torch's build: {build}). Reinstall both in one "
                f"pip call from one index: `{sys.executable} -m pip install --force-reinstall torch torchvision` "
                "(pip's configured index, PyPI: it always works, with CUDA libraries on Linux); where PyTorch's "
                "CPU index is reachable, adding `--index-url https://download.pytorch.org/whl/cpu` gives the "
                "CPU-only builds. Then run make again")
    return None


def main() -> int:
    found = problem()
    if found is None:
        return 0
    print(f"cfl install check: {found}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
