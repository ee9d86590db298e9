"""A config is code: ``stream.benchmark`` names a callable that cfl imports and calls with ``stream.args``
(``subprocess.getoutput`` with ``stream.args.cmd`` would run a shell command). A config file, ``--set``,
``cfl.run`` and a resumed run's ``config.yaml`` come from the user who runs cfl; a W&B sweep's parameters
come from whoever defined the sweep. A ``stream.benchmark`` from such a source is admitted only when it is
an Avalanche benchmark (``avalanche.benchmarks.*``) or a callable of a ``--plugin`` file, or when the user
trusts it explicitly (``cfl run --trust-callables`` or ``CFL_TRUST_CALLABLES=1``); otherwise it is refused
before anything of it is imported (docs/streams.md, "A config is code").
"""

from __future__ import annotations

import os
from typing import Any

from cfl.config.schema import ConfigError

TRUST_ENV = "CFL_TRUST_CALLABLES"
AVALANCHE = "avalanche.benchmarks"


def trusted_by_env() -> bool:
    """``CFL_TRUST_CALLABLES=1`` in the environment."""
    return os.environ.get(TRUST_ENV) == "1"


def admitted_modules() -> tuple[str, ...]:
    """Modules whose callables a config from another author may name: Avalanche's benchmarks and the
    ``--plugin`` files imported in this process."""
    from cfl.plugin_files import LOADED

    return (AVALANCHE, *sorted(module.__name__ for module in LOADED.values()))


def _within(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in modules)


def check_foreign_benchmark(path: Any, source: str) -> None:
    """Refuse ``stream.benchmark: path`` given by ``source`` (not the config's author) unless it names a
    callable of :func:`admitted_modules`; the path is checked before its module is imported, the callable's
    own module after."""
    from cfl.data.avalanche_route import import_callable

    modules = admitted_modules()
    fix = (f"{source} may name only callables of {', '.join(modules)} (--plugin files included); if you trust "
           f"it, run with --trust-callables or {TRUST_ENV}=1, or name the benchmark in the config file itself")
    if not isinstance(path, str) or not _within(path, modules) or any(p.startswith("_") for p in path.split(".")):
        raise ConfigError(f"'stream.benchmark: {path}' comes from {source}: a config is code (cfl imports and calls "
                          f"this callable); {fix}")
    where = getattr(import_callable(path), "__module__", None)
    if not isinstance(where, str) or not _within(where, modules):
        raise ConfigError(f"'stream.benchmark: {path}' comes from {source} and is defined in module {where}, "
                          f"not in the module it is named through; {fix}")
