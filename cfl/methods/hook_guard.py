"""A method's hooks are the user's code: a hook that raises, or returns what breaks its rule, is reported as
a :class:`HookError` naming the method, the file that defines it, the hook and the rule, instead of a
traceback from deep inside the engine (often from under ``torch.func.vmap``).

The engine wraps each hook call and the use of its result in ``with guarded(method, "hook"):``; the rule
checks of :mod:`cfl.engine.hook_rules` raise :class:`BrokenRule` inside that block. A ``HookError`` is a
``ConfigError`` (exit code 2, nothing written) until training starts; during training the run stops with
exit code 3 and its last checkpoint kept (``cfl.app.single_run``).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from cfl.config.schema import ConfigError
from cfl.failures import USER_FAILURES, one_line, show_traceback

#: the step hooks: each sees and may rewrite one local step (cfl/engine/local/step_hooks.py runs them); a declared part
#: is named ``hook.part`` (``samples.step``, ``client_start.carry``: cfl/engine/hook_call.py ``takes``)
STEP_HOOKS = ("samples.step", "step_gradient", "client_start.carry", "carry_step")
#: the hooks the batched engine runs under ``torch.func.vmap`` over clients (docs/plugins.md, "Rules that keep a
#: method fast and correct"): the one list the engine, the dry call and the messages read
VMAPPED_HOOKS = ("round_terms", "loss", "step_gradient", "carry_step")
VMAP_HINT = (f"; the batched engine runs {', '.join(VMAPPED_HOOKS[:-1])} and {VMAPPED_HOOKS[-1]} under "
             "torch.func.vmap: write them as pure tensor functions of one client (no .item(), no Python branching on "
             "tensor values, no in-place writes to their inputs; docs/plugins.md)")


class BrokenRule(ValueError):
    """What a hook returned breaks the hook's rule (the message is the rule and what was returned)."""


class HookError(ConfigError):
    """A method's hook raised or broke its rule."""

    def __reduce__(self) -> tuple[type[HookError], tuple[str]]:  # crosses process boundaries (sweep --jobs)
        return type(self), (str(self),)


def _class(method: Any) -> type:
    return method if isinstance(method, type) else type(method)


def origin_of(method: Any) -> str:
    """The file that defines ``method``'s class (a plugin file, or a module of cfl)."""
    module = sys.modules.get(_class(method).__module__)
    return getattr(module, "__file__", None) or _class(method).__module__


def hook_error(method: Any, hook: str, err: BaseException) -> HookError:
    """The :class:`HookError` of ``method.hook`` (a method or its class) for ``err`` (a broken rule, or what the
    hook raised)."""
    cls = _class(method)
    where = f"method '{getattr(cls, 'name', cls.__name__)}' ({cls.__name__} in {origin_of(method)}), hook {hook}"
    if isinstance(err, BrokenRule):
        return HookError(f"{where}: {err}")
    show_traceback(err)
    hint = VMAP_HINT if "vmap" in str(err) else ""
    return HookError(f"{where} raised {one_line(err)}{hint} (CFL_TRACEBACK=1 shows the traceback)")


class guarded:  # noqa: N801 -- used as ``with guarded(...)``, like contextlib's lower-case managers
    """Turn what ``method.hook`` (and the engine's use of its result) raises into a :class:`HookError`."""

    __slots__ = ("hook", "method")

    def __init__(self, method: Any, hook: str) -> None:
        self.method, self.hook = method, hook

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if err is None or isinstance(err, HookError) or not isinstance(err, USER_FAILURES):
            return False  # nothing raised, already attributed, or Ctrl-C / SIGTERM
        raise hook_error(self.method, self.hook, err) from err
