"""The one way the engine calls a method's hook (:func:`call`): the override check, the guard (what the hook or the
engine's use of its result raises names the method, its file and the hook: :mod:`cfl.methods.hook_guard`), the
optional arguments an override takes, the read-only check of its arguments, the rule check of its result, the
finite check and the plain-state check of the server state it may change. :func:`refuse` reports a broken rule
the engine finds outside a call (two clients' states that do not stack, a task-start key changed mid-task).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, NoReturn

import torch

from cfl.engine.hook_rules import FINITE, PLAIN_STATE, READ_ONLY
from cfl.engine.stores.checkpoint import CheckpointError, check_plain
from cfl.methods.base import Method, overrides
from cfl.methods.declarations import gives
from cfl.methods.hook_guard import BrokenRule, guarded, hook_error
from cfl.methods.hook_signatures import accepts
from cfl.methods.hook_types import Samples
from cfl.tensors import State

#: what :func:`call` returns, without calling, for a hook the method does not override (``default=SKIP``: call it)
SKIP: Any = object()


def call(method: Any, hook: str, *args: Any, optional: dict[str, Any] | None = None,
         use: Callable[[Any], Any] | None = None, finite: dict[str, Any] | None = None,
         read_only: dict[str, Any] | None = None, server: State | None = None, default: Any = SKIP) -> Any:
    """``method.hook(*args)``, the one way the engine calls a hook (``method``: a method, or its class for
    ``__init__``).

    ``default``: what to return without calling where the method does not override ``hook`` (the base class's
    hook is called where it is left out). ``optional``: arguments passed only to an override that names them (a
    hook's newer arguments). ``use``: the engine's use of the result (the rule check of
    :mod:`cfl.engine.hook_rules` and what it derives), inside the guard, so a broken rule names the hook.
    ``finite``: the arguments whose finite values the result must keep finite (under :class:`finite_checks`).
    ``read_only``: the arguments the hook must not write into (:class:`unwritten`). ``server``: the server state
    the hook may change, which must stay fit for a checkpoint."""
    if default is not SKIP and not overrides(method, hook):
        return default
    bound = getattr(method, hook) if hook != "__init__" else method
    more = {k: v for k, v in (optional or {}).items() if accepts(method, hook, k)}
    with guarded(method, hook):
        if read_only is None:
            result = bound(*args, **more)
        else:
            with unwritten(method, hook, read_only):
                result = bound(*args, **more)
        if use is not None:
            result = use(result)
        if finite is not None:
            made_finite(result, finite)
    if server is not None:
        plain_server(method, hook, server)
    return result


def blamed(method: Any, hook: str, check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``, the engine's check of what ``method``'s ``hook`` made (found outside a call: two clients'
    states that do not stack), a broken rule naming the hook."""
    with guarded(method, hook):
        return check(*args)


def refuse(method: Any, hook: str, rule: str) -> NoReturn:
    """Report that ``method``'s ``hook`` broke ``rule`` (found by the engine outside a call)."""
    raise hook_error(method, hook, BrokenRule(rule))


def plain_server(method: Method, hook: str, server: State) -> None:
    """Refuse a server state that ``method.hook`` left unfit for a checkpoint (a function, a module, a numpy array:
    :func:`cfl.engine.stores.checkpoint.check_plain`), naming the hook, before the next checkpoint would fail on it."""
    try:
        check_plain(server, "server")
    except CheckpointError as err:
        refuse(method, hook, f"{PLAIN_STATE}; {str(err).split(';')[0]}")


def _tensors(tree: Any, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``tree`` (nested dicts, lists, tuples, ``Samples``) with its path from ``name``."""
    if isinstance(tree, torch.Tensor):
        if not tree.is_inference():  # an inference tensor keeps no version counter
            yield name, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _tensors(v, f"{name}[{k!r}]")
    elif isinstance(tree, (list, tuple)):
        fields = getattr(tree, "_fields", None)
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{name}.{fields[i]}" if fields else f"{name}[{i}]")
    elif isinstance(tree, Samples):
        for k in ("x", "y", "task", "weight", "extra"):
            yield from _tensors(getattr(tree, k, None), f"{name}.{k}")


class unwritten:  # noqa: N801 -- used as ``with unwritten(...)``, like :class:`guarded`
    """Refuse in-place writes by ``method.hook`` into its read-only ``arguments`` ({name: tensors}), seen by the
    tensors' version counters (``tensor._version``, bumped by every in-place op, also one made under ``vmap`` on
    the tensor it maps over). Used around the dry call and a round's first call only (a few attribute reads per
    argument tensor, no device work)."""

    __slots__ = ("hook", "method", "seen")

    def __init__(self, method: Method, hook: str, arguments: dict[str, Any]) -> None:
        self.method, self.hook = method, hook
        first = {id(t): (n, t) for name, tree in reversed(arguments.items()) for n, t in _tensors(tree, name)}
        self.seen = [(n, t, t._version) for n, t in reversed(first.values())]  # each tensor once, by its first name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> bool:
        if err is not None:
            return False
        written = [n for n, t, version in self.seen if t._version != version]
        if written:
            refuse(self.method, self.hook, f"{READ_ONLY}; it wrote into {written[0]}"
                   + (" and more" if len(written) > 1 else ""))
        return False


class finite_checks:  # noqa: N801 -- used as ``with finite_checks():``
    """While active, the hooks refuse a result holding NaN or inf made from finite arguments (naming the hook).
    Off during training (each check would synchronise the device); the round engine turns it on to re-run the
    clients a non-finite round stopped on, so the message names the hook that made the values, not lr."""

    on = False

    def __enter__(self) -> None:
        finite_checks.on = True

    def __exit__(self, *exc: object) -> None:
        finite_checks.on = False


def _nonfinite(tree: Any, name: str) -> str | None:
    """The path of the first float tensor of ``tree`` holding NaN or inf, or None."""
    return next((n for n, t in _tensors(tree, name) if t.is_floating_point() and not bool(torch.isfinite(t).all())),
                None)


def made_finite(result: Any, arguments: dict[str, Any]) -> None:
    """Under :class:`finite_checks`: refuse a hook's ``result`` holding NaN or inf where its ``arguments`` hold none."""
    if not finite_checks.on:
        return
    bad = _nonfinite(result, "the result")
    if bad is not None and all(_nonfinite(v, k) is None for k, v in arguments.items()):
        raise BrokenRule(f"{FINITE}; in {bad}")


def takes(method: Method, name: str) -> bool:
    """Whether ``method`` takes ``name``: a hook its class overrides, or ``"hook.part"`` a part it declares."""
    hook, _, part = name.partition(".")
    return gives(method, part) if part else overrides(method, hook)
