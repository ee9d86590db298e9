"""Figure titles: what a run is (stream, method with its non-default parameters, partition, seed)."""

from __future__ import annotations

import dataclasses
from typing import Any


def _changed_params(spec: dict[str, Any]) -> list[str]:
    """``key=value`` for each parameter of a method spec that differs from the method's default."""
    from cfl.methods import METHODS

    cls = METHODS.get(spec.get("name", ""))
    defaults = {} if cls is None else {f.name: f.default for f in dataclasses.fields(cls.Hyperparams)
                                       if f.default is not dataclasses.MISSING}
    return [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in spec.items() if k != "name" and (k not in defaults or defaults[k] != v)]


def method_with_params(results: dict[str, Any]) -> str:
    """The method label with the parameters set away from their defaults, e.g. ``fot (eps=0.9)``."""
    config = results.get("config") or {}
    specs = [config.get("method") or {}, *(config.get("plugins") or [])]
    changed = [p for spec in specs for p in _changed_params(spec)]
    return f"{results['method']} ({', '.join(changed)})" if changed else results["method"]


def run_title(results: dict[str, Any]) -> str:
    """One line naming the run: ``stream · method (params) · partition · seed N``."""
    return f"{results['stream']} · {method_with_params(results)} · {results['partition']} · seed {results['seed']}"
