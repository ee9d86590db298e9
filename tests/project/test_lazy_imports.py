"""Start-up cost: heavy optional packages are imported only where a command needs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("avalanche", "wandb", "matplotlib", "ray", "sklearn", "scipy", "torch")
PROBE = f"""
import json, sys
loaded = {{}}
for module in ("cfl.app.cli", "cfl.app.single_run"):
    __import__(module)
    loaded[module] = sorted(name for name in {HEAVY!r} if name in sys.modules)
print(json.dumps(loaded))
"""


def test_cli_and_run_modules_import_no_optional_heavy_package() -> None:
    """``cfl --help`` pays for none of them; a run imports torch and nothing else until it needs it
    (Avalanche for an Avalanche stream, W&B unless ``wandb.mode: disabled``, matplotlib for the plots)."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], check=True)
    assert json.loads(proc.stdout) == {"cfl.app.cli": [], "cfl.app.single_run": ["torch"]}
