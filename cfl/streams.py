"""Public stream API: register your own dataset as a named stream (``cfl.streams.register``, docs/own-dataset.md),
lend a built :class:`Stream` to one run, and turn Avalanche benchmarks into cfl streams and back
(``from_avalanche`` / ``to_avalanche``, docs/streams.md; Avalanche is imported only when they are called)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cfl.config.schema import ConfigError
from cfl.data.avalanche_in import from_avalanche
from cfl.data.avalanche_out import to_avalanche
from cfl.data.request import StreamRequest
from cfl.data.stream import SCENARIOS, Stream, Task, prefix
from cfl.data.stream_checks import check_stream
from cfl.data.stream_registry import STREAMS, StreamEntry
from cfl.redefinition import Definition, definition_of
from cfl.registry import name_error

__all__ = ["STREAMS", "SCENARIOS", "Stream", "StreamRequest", "Task", "register", "registered", "unregister",
           "lent", "from_avalanche", "to_avalanche"]

def register(name: str, build: Callable[[StreamRequest], Stream], *, tasks: int, scenarios: tuple[str, ...],
             input_shape: tuple[int, ...], classes_per_task: int, default_model: str, about: str = "",
             head: int | None = None) -> StreamEntry:
    """Add stream ``name`` to the registry (``stream.name: NAME`` in a config, listed by ``cfl list``).

    ``build(request)`` returns the first ``request.num_tasks`` tasks as a :class:`Stream` under
    ``request.scenario`` (one of ``scenarios``, the first being the default). The metadata (``tasks`` in
    all, ``input_shape`` of one sample, ``classes_per_task``, ``default_model`` for ``model: auto``)
    lets configs be validated without loading data; the built stream is checked against it when loaded.
    Raises :class:`ConfigError` on a bad argument or a name already registered by another ``build``; the same
    ``build`` function registered again (a re-run notebook cell, an edited plugin file imported again: same
    module and qualified name) replaces the entry with a warning.
    """
    entry = _checked_entry(name, build, tasks, scenarios, input_shape, classes_per_task, default_model, head,
                           definition=definition_of(build))
    return STREAMS.register(name, entry, about=about or f"{name} (registered by a plugin)", defined_by=build)


def _checked_entry(name: str, build: Callable[[StreamRequest], Stream], tasks: int, scenarios: tuple[str, ...],
                   input_shape: tuple[int, ...], classes_per_task: int, default_model: str,
                   head: int | None = None, *, definition: Definition | None = None) -> StreamEntry:
    """The registry entry for :func:`register`'s arguments, each checked (a taken name too, unless taken by
    the same ``definition``: :meth:`Registry.refuse_taken`)."""
    if (why := name_error("stream", name)) is not None:  # the rule of every registry, checked before the rest
        raise ConfigError(why)
    if not callable(build):
        raise ConfigError(f"stream '{name}': build must be a callable taking a StreamRequest, got "
                          f"{type(build).__name__}")
    scenarios = tuple(scenarios) if isinstance(scenarios, (list, tuple)) else (scenarios,)
    if not scenarios or any(s not in SCENARIOS for s in scenarios) or len(set(scenarios)) != len(scenarios):
        raise ConfigError(f"stream '{name}': scenarios {scenarios!r} must be distinct names among {SCENARIOS}")
    for label, value in (("tasks", tasks), ("classes_per_task", classes_per_task), ("head", head or 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"stream '{name}': {label} must be a positive integer, got {value!r}")
    shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else ()
    if not shape or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in shape):
        raise ConfigError(f"stream '{name}': input_shape must be a tuple of positive integers (one sample's "
                          f"shape, e.g. (1, 28, 28)), got {input_shape!r}")
    entry = StreamEntry(build, tasks, scenarios, shape, classes_per_task, default_model, head)
    STREAMS.refuse_taken(name, definition)
    with STREAMS.temporarily(name, entry, replace=True):  # the fit check looks the stream up by name
        _check_default_model(name, entry)
    return entry


def _check_default_model(name: str, entry: StreamEntry) -> None:
    from cfl.cross_checks import model_fit_error
    from cfl.models import MODELS

    if entry.default_model not in MODELS:
        raise ConfigError(f"stream '{name}': default_model '{entry.default_model}' is not a model; available: "
                          f"{', '.join(MODELS)}")
    for scenario in entry.scenarios:
        reason = model_fit_error(entry.default_model, name, scenario, None)
        if reason is not None:
            raise ConfigError(f"stream '{name}': default_model '{entry.default_model}' does not take inputs "
                              f"{entry.input_shape} ({scenario}-incremental): {reason}")


def unregister(name: str) -> None:
    """Remove a stream added by :func:`register`."""
    STREAMS.unregister(name)


@contextmanager
def registered(name: str, build: Callable[[StreamRequest], Stream], *, about: str = "",
               **metadata: Any) -> Iterator[StreamEntry]:
    """:func:`register` for the ``with`` block only (tests, notebooks): the registry is restored after it."""
    entry = _checked_entry(name, build, **metadata)
    with STREAMS.temporarily(name, entry, about=about or f"{name} (registered by a plugin)"):
        yield entry


@contextmanager
def lent(stream: Stream, name: str | None = None) -> Iterator[str]:
    """Register a built :class:`Stream` under ``name`` (default: its own name) for one run (``cfl.run(...,
    stream=...)``, or ``stream.name: avalanche``): validation sees its real input shape, head and default
    model; its prefixes are its first tasks. Its tensors are checked first (:func:`check_stream`)."""
    if not isinstance(stream, Stream):
        raise ConfigError(f"stream= takes a cfl Stream (cfl.streams.Stream, e.g. from a builder or "
                          f"from_avalanche), got {type(stream).__name__}")
    check_stream(stream)  # before the config is validated against it, so before any run file
    name = stream.name if name is None else name
    with registered(name, lambda request: prefix(stream, request.num_tasks), tasks=stream.num_tasks,
                    scenarios=(stream.scenario,), input_shape=tuple(stream.input_shape),
                    classes_per_task=stream.classes_per_head, head=stream.classes_per_head,
                    default_model=stream.default_model, about=f"{stream.name} (a Stream object lent to one run)"):
        yield name
