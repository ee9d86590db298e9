"""The config route to Avalanche benchmarks: ``stream: {name: avalanche, benchmark: DOTTED.PATH, args: {...}}``.

The callable at ``benchmark`` is imported and called with ``args`` when the config is validated; its result
must be an Avalanche benchmark, converted once by :func:`cfl.data.avalanche_in.from_avalanche` and kept for
the run that follows (docs/streams.md). Every failure is a :class:`ConfigError` (exit code 2) raised before
a run directory exists. Avalanche itself is imported only by the callable, never here.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from cfl.config.schema import ConfigError
from cfl.data.avalanche_in import from_avalanche
from cfl.data.stream import Stream, prefix
from cfl.data.stream_registry import STREAMS, StreamEntry
from cfl.failures import USER_FAILURES, one_line

ROUTE = "avalanche"
EXAMPLE = ("e.g. stream: {name: avalanche, benchmark: avalanche.benchmarks.classic.SplitMNIST, "
           "args: {n_experiences: 5, seed: 0, dataset_root: data/mnist}}")
#: converted benchmarks kept per process: a run validates, then loads, the same one
KEEP = 2
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_kept: OrderedDict[str, Stream] = OrderedDict()


def uses_route(stream: Any) -> bool:
    """Whether a ``StreamConfig`` names the route or gives one of its keys (then it is checked)."""
    return stream.name == ROUTE or stream.benchmark is not None or bool(stream.args)


def check_keys(stream: Any) -> None:
    """Refuse the route's keys on other streams, a missing ``benchmark``, and keys the route does not read."""
    if stream.name != ROUTE:
        given = "benchmark" if stream.benchmark is not None else "args"
        raise ConfigError(f"'stream.{given}' is read only with 'stream.name: {ROUTE}' (an Avalanche benchmark), "
                          f"but stream.name is '{stream.name}'; remove it, or use {EXAMPLE}")
    if stream.benchmark is None:
        raise ConfigError(f"'stream.name: {ROUTE}' needs 'stream.benchmark', the dotted path of a callable that "
                          f"returns an Avalanche benchmark; {EXAMPLE}")
    if stream.seed is not None:
        raise ConfigError(f"'stream.seed' is not read by 'stream.name: {ROUTE}': give the benchmark's own seed in "
                          "stream.args (e.g. stream.args.seed: 0), or remove stream.seed")
    if stream.download:
        raise ConfigError(f"'stream.download' is not read by 'stream.name: {ROUTE}': Avalanche's benchmarks fetch "
                          "their own data (e.g. into stream.args.dataset_root); remove stream.download")
    bad = [k for k in stream.args or {} if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise ConfigError(f"'stream.args' keys must be argument names of {stream.benchmark}, got {bad!r}")


def import_callable(path: str) -> Callable[..., Any]:
    """The object at ``path`` (``package.module.name``, attributes after the module allowed), callable."""
    if not isinstance(path, str) or not _DOTTED.fullmatch(path):
        raise ConfigError(f"'stream.benchmark: {path}' must be a dotted path module.callable, e.g. "
                          "avalanche.benchmarks.classic.SplitMNIST or mypackage.benchmarks.make")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name or module_name.startswith(f"{err.name}."):
                continue  # no module of this name: try a shorter prefix
            raise _import_failed(path, module_name, err) from None
        except USER_FAILURES as err:  # any failure of the module's own code, sys.exit too: the same refusal
            raise _import_failed(path, module_name, err) from None
        break
    else:
        raise ConfigError(f"'stream.benchmark: {path}': no module '{parts[0]}' can be imported; install it, or "
                          f"put the folder holding it on PYTHONPATH (e.g. PYTHONPATH=. cfl run ...)")
    for i, attr in enumerate(parts[cut:], start=cut):
        if not hasattr(obj, attr):
            tried = f" (and there is no module '{'.'.join(parts[:i + 1])}')" if i < len(parts) - 1 else ""
            raise ConfigError(f"'stream.benchmark: {path}': '{'.'.join(parts[:i])}' has no attribute '{attr}'{tried}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ConfigError(f"'stream.benchmark: {path}' is not callable (it is of type {type(obj).__name__}); name a "
                          "callable that returns an Avalanche benchmark")
    return obj


def _import_failed(path: str, module: str, err: BaseException) -> ConfigError:
    return ConfigError(f"'stream.benchmark: {path}': importing module '{module}' failed: "
                       f"{one_line(err)}")


def is_benchmark(obj: Any) -> bool:
    """An Avalanche benchmark (``CLScenario``); without Avalanche imported, nothing can be one."""
    if "avalanche" not in sys.modules:
        return False
    from avalanche.benchmarks.scenarios.generic_scenario import CLScenario

    return isinstance(obj, CLScenario)


def build_benchmark(path: str, args: dict[str, Any]) -> Any:
    """Import ``path`` and call it with ``args``; refuse a failure or a result that is not a benchmark."""
    make = import_callable(path)
    try:
        benchmark = make(**args)
    except USER_FAILURES as err:  # whatever the callable raises, sys.exit too, is a refusal of this config
        raise ConfigError(f"'stream.benchmark: {path}' failed when called with stream.args {args}: "
                          f"{one_line(err)}") from None
    if not is_benchmark(benchmark):
        raise ConfigError(f"'stream.benchmark: {path}' returned a {type(benchmark).__name__}, not an Avalanche "
                          "benchmark (a CLScenario, e.g. from SplitMNIST or nc_benchmark)")
    return benchmark


def _key(path: str, args: dict[str, Any], scenario: str) -> str:
    return json.dumps([path, args, scenario], sort_keys=True, default=repr)


def converted(path: str, args: dict[str, Any], scenario: str) -> Stream:
    """The benchmark as a cfl :class:`Stream` (named ``avalanche-<callable>``), converted once per process
    (the last ``KEEP`` kept); the time to build and to convert it is printed."""
    key = _key(path, args, scenario)
    if key in _kept:
        _kept.move_to_end(key)
        return _kept[key]
    started = time.perf_counter()
    benchmark = build_benchmark(path, args)
    built = time.perf_counter()
    try:
        stream = from_avalanche(benchmark, scenario=scenario, name=f"{ROUTE}-{path.rsplit('.', 1)[1]}")
    except ConfigError as err:
        raise ConfigError(f"'stream.benchmark: {path}': {err}") from None
    except Exception as err:  # noqa: BLE001 - a dataset that cannot be read is a refusal of this config
        raise ConfigError(f"'stream.benchmark: {path}': reading its experiences failed: "
                          f"{type(err).__name__}: {err}") from None
    samples = sum(len(t.train_y) + len(t.test_y) for t in stream.tasks)
    print(f"cfl: {path}: built in {built - started:.2f} s (imports included), its {stream.num_tasks} experiences "
          f"({samples} samples) converted to tensors in {time.perf_counter() - built:.2f} s", file=sys.stderr)
    _kept[key] = stream
    while len(_kept) > KEEP:
        _kept.popitem(last=False)
    return stream


def route_stream(stream_cfg: Any) -> Stream | None:
    """For ``stream.name: avalanche``: the converted benchmark (its keys checked first); None for other streams."""
    if not uses_route(stream_cfg):
        return None
    check_keys(stream_cfg)
    if ROUTE in STREAMS:
        raise ConfigError(f"a plugin registered a stream named '{ROUTE}', the name of cfl's route to Avalanche "
                          f"benchmarks (stream.benchmark); register it under another name")
    return converted(stream_cfg.benchmark, dict(stream_cfg.args or {}), stream_cfg.scenario)


def entry_of(stream: Stream) -> StreamEntry:
    """The registry entry of a converted benchmark: its own scenario, shapes and default model; its prefixes
    are its first tasks."""
    head = stream.classes_per_head
    return StreamEntry(lambda request: prefix(stream, request.num_tasks), stream.num_tasks, (stream.scenario,),
                       tuple(stream.input_shape), head, stream.default_model, head)
