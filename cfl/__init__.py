"""cfl: a continual federated learning benchmark (tasks x rounds x clients, methods as plugins)."""

import os

__version__ = "0.1.0"

# Back torch's large CPU tensors with transparent huge pages (torch reads this once, at its first CPU
# allocation, so it must be set before any tensor exists). The batched engine allocates its stacked
# gradients (~160 MB for 64 MLP clients) every step; with 4 KiB pages each allocation costs ~40k page
# faults, which doubled the weight-gradient products (docs/performance.md). Set it to 0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

#: the Python API (docs/python-api.md), imported on first use so that ``import cfl`` stays cheap
_LAZY = {"run": "cfl.app.api", "resume": "cfl.app.api", "Config": "cfl.config.keys", "ConfigError": "cfl.config.schema",
         "Stream": "cfl.data.stream", "Task": "cfl.data.stream"}
__all__ = ["run", "resume", "Config", "ConfigError", "Stream", "Task", "streams", "__version__"]


def __getattr__(name: str) -> object:
    import importlib

    if name == "streams":
        return importlib.import_module("cfl.streams")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cfl' has no attribute {name!r}")
