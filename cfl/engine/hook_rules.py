"""What each hook must return (docs/plugins.md), checked where the engine takes the result: a few ``isinstance``
and shape comparisons per call, so a wrong result is named at its hook instead of failing later in the engine.
Each check raises :class:`~cfl.methods.hook_guard.BrokenRule` (inside ``guarded``, which names the method)."""

from __future__ import annotations

from typing import Any, get_args

import torch

from cfl.methods.declarations import DrawPart, LossPart
from cfl.methods.hook_guard import BrokenRule
from cfl.methods.hook_types import Linear, Quadratic, Samples
from cfl.methods.traffic_hooks import ParamRoles
from cfl.methods.training_hooks import Draw, LossTerms
from cfl.tensors import Params

PENALTY = ("must give as penalty None or {parameter name: Quadratic(weight, anchor) (optionally linear=) or "
           "Linear(coef)}, the anchor, linear and coef floating point and shaped like the parameter")
PRECONDITIONER = ("must give as preconditioner None or {weight name: matrix (d, d)}, d the weight's size over its "
                  "first dim (im2col width); weights only (2 or more dims)")
PROJECTION = ("must give as projection None or {parameter name: basis (d, k)}, d the parameter's size over its first "
              "dim (im2col width)")
TASK_LOSS = ("must return LossTerms(task=) one float loss per sample of the batch, a tensor of shape (B,) with B = "
             "ctx.logits.shape[0], computed from logits or params (it replaces the cross-entropy: the step's gradient "
             "is its gradient)")
EXTRA_LOSS = ("must return LossTerms(extra=) one float loss per sample of the batch ctx.x, a tensor of shape (B,) with "
              "B = ctx.x.shape[0]")
REPLAY = ("must return None or Draw(replay=None or Samples(x, y, task)): x shaped like the stream's inputs, y and task "
          "integer vectors")
STEP_SAMPLES = ("must return None or Draw(step=None or Samples(x, y, task)): x shaped like the stream's inputs, y and "
                "task integer vectors")
#: a result's parts (loss's LossTerms, samples' Draw): the one asked for (``ctx.part``), which the class declares
PARTS = "must return only the part asked for (ctx.part), one its class declares (computes.losses, computes.draws)"
STEP_GRADIENT = "must return None or the step's gradient: {every parameter name: float tensor shaped like it}"
CARRY_START = ("must give as carry None or a dict of tensors (nested dicts allowed), the same keys and shapes for "
               "every client")
CLIENT_STATE = ("must keep, in a client state that hooks run under vmap read, tensors of the same shape under a key "
                "for every client (the batched engine stacks them over the clients)")
#: the part of a hook's rule that no check of one result can see (docs/plugins.md, "Rules that keep a method ...")
READ_ONLY = "must not write into its arguments in place (return new tensors; only the arguments documented as " \
    "updated in place may change)"
PLAIN_STATE = ("must keep only tensors, numbers, strings and lists/dicts of them in its server state (it is "
               "checkpointed)")
FINITE = ("made non-finite values (NaN or inf) from finite arguments (the run stopped on them: a hook's division by "
          "zero, log of 0 or overflow, not lr, is the cause)")
CARRY_STEP = "must return a dict shaped like step.carry: the same keys, each tensor of the same shape and dtype"
UPLOAD = "must return None or the client's upload, a dict"
BEFORE_TASK_END = ("must return None at 'before_task_end': it writes what it keeps into its server state "
                   "(ctx.server) in place")
SERVER_UPDATE = "must return None or the new global parameters: {every parameter name: float tensor shaped like it}"
TRANSFORM = "must return the server step: {every parameter name: float tensor shaped like it}"
AFTER_SERVER_STEP = ("must return None or ServerChange(params): params new global values of some parameters: "
                     "{parameter name: tensor shaped like it, of its dtype}")
SERVER_CHANGE = ("must return None or ServerChange(params, backbone): backbone only at 'task_end' and for a method "
                 "declaring changes_backbone")


def _got(value: Any) -> str:
    return f"got {type(value).__name__}" if not isinstance(value, torch.Tensor) else \
        f"got a {value.dtype} tensor of shape {tuple(value.shape)}"


def _parameter(key: object, params: Params, rule: str) -> torch.Tensor:
    if key not in params:
        raise BrokenRule(f"{rule}; {key!r} is not a parameter (the model's: {', '.join(params)})")
    return params[key]


def _broadcasts(weight: torch.Tensor, p: torch.Tensor) -> bool:
    try:
        return torch.broadcast_shapes(weight.shape, p.shape) == p.shape
    except RuntimeError:
        return False


def check_penalty(result: Any, params: Params) -> dict[str, Quadratic]:
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise BrokenRule(f"{PENALTY}; {_got(result)}")
    for key, q in result.items():
        p = _parameter(key, params, PENALTY)
        if isinstance(q, Linear):
            _check_coefficient(q.coef, p, f"the coef of '{key}'")
            continue
        if not isinstance(q, Quadratic):
            raise BrokenRule(f"{PENALTY}; for '{key}' {_got(q)}")
        if q.linear is not None:
            _check_coefficient(q.linear, p, f"the linear coefficient of '{key}'")
        if not isinstance(q.anchor, torch.Tensor) or q.anchor.shape != p.shape or not q.anchor.is_floating_point():
            raise BrokenRule(f"{PENALTY}; the anchor of '{key}' (shape {tuple(p.shape)}) {_got(q.anchor)}")
        weight = q.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float, torch.Tensor)) or (
                isinstance(weight, torch.Tensor) and weight.shape != p.shape and not _broadcasts(weight, p)):
            raise BrokenRule(f"{PENALTY}; the weight of '{key}' must be a number or a tensor that broadcasts to "
                             f"{tuple(p.shape)}, {_got(weight)}")
    return result


def _check_coefficient(coef: Any, p: torch.Tensor, what: str) -> None:
    if not isinstance(coef, torch.Tensor) or coef.shape != p.shape or not coef.is_floating_point():
        raise BrokenRule(f"{PENALTY}; {what} (shape {tuple(p.shape)}) {_got(coef)}")


def check_extra_loss(result: Any, x: torch.Tensor, rule: str = EXTRA_LOSS) -> torch.Tensor:
    if not isinstance(result, torch.Tensor) or result.shape != (x.shape[0],) or not result.is_floating_point():
        raise BrokenRule(f"{rule} (here {x.shape[0]}); {_got(result)}")
    return result


def asked_part(result: Any, kind: type, part: str, declared: tuple[str, ...], rule: str) -> Any:
    """The ``part`` of a ``loss`` (``kind`` :class:`LossTerms`) or ``samples`` (:class:`Draw`) result (None: a draw
    left out), the others None; a part the class does not declare, or other than asked, breaks :data:`PARTS`."""
    if result is None and kind is Draw:
        return None
    if not isinstance(result, kind):
        raise BrokenRule(f"{rule}; {_got(result)}")
    for other in get_args(LossPart) if kind is LossTerms else get_args(DrawPart):
        if other != part and getattr(result, other) is not None:
            undeclared = "" if other in declared else f", which its class does not declare ({declared})"
            raise BrokenRule(f"{PARTS}; got {kind.__name__}.{other} at a call for part {part!r}{undeclared}")
    return getattr(result, part)


def _check_matrices(result: Any, params: Params, rule: str, fits: Any, weights_only: bool) -> dict[str, torch.Tensor]:
    """``{parameter name: matrix}`` with each matrix ``fits(matrix, d)``, ``d`` the parameter's im2col width (None:
    ``{}``)."""
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise BrokenRule(f"{rule}; {_got(result)}")
    for key, matrix in result.items():
        p = _parameter(key, params, rule)
        width = p.numel() // max(p.shape[0], 1) if p.dim() else 1
        if weights_only and p.dim() < 2:
            raise BrokenRule(f"{rule}; '{key}' has shape {tuple(p.shape)}")
        if not isinstance(matrix, torch.Tensor) or not matrix.is_floating_point() or not fits(matrix, width):
            raise BrokenRule(f"{rule}; for '{key}' (d = {width}) {_got(matrix)}")
    return result


def check_preconditioner(result: Any, params: Params) -> dict[str, torch.Tensor]:
    return _check_matrices(result, params, PRECONDITIONER, lambda m, d: m.shape == (d, d), weights_only=True)


def check_projection(result: Any, grads: Params) -> dict[str, torch.Tensor]:
    return _check_matrices(result, grads, PROJECTION, lambda m, d: m.dim() == 2 and m.shape[0] == d,
                           weights_only=False)


def check_replay(result: Any, like: torch.Tensor) -> Samples | None:
    if result is None:
        return None
    if not isinstance(result, Samples):
        raise BrokenRule(f"{REPLAY}; {_got(result)}")
    x, y, task = result.x, result.y, result.task
    if not isinstance(x, torch.Tensor) or x.shape[1:] != like.shape[1:]:
        raise BrokenRule(f"{REPLAY}; x must be of shape (n, {', '.join(map(str, like.shape[1:]))}), {_got(x)}")
    for label, v in (("y", y), ("task", task)):
        if not isinstance(v, torch.Tensor) or v.shape != (x.shape[0],) or v.is_floating_point():
            raise BrokenRule(f"{REPLAY}; {label} must be an integer vector of {x.shape[0]} (as x), {_got(v)}")
    if result.extra:
        raise BrokenRule(f"{REPLAY}; replay samples join the step's batch, which carries no extras: got extra "
                         f"{sorted(result.extra)} (draw them as the step part, whose extras reach the step hooks and "
                         "the loss's extra part)")
    return result


def check_step_samples(result: Any, like: torch.Tensor) -> Samples | None:
    if isinstance(result, Samples) and result.extra:
        extra = result.extra
        result = Samples(result.x, result.y, result.task, result.weight)
    else:
        extra = {}
    try:
        result = check_replay(result, like)
    except BrokenRule as broken:
        raise BrokenRule(str(broken).replace(REPLAY, STEP_SAMPLES)) from None
    if not isinstance(extra, dict):
        raise BrokenRule(f"{STEP_SAMPLES}; extra must be a dict of per-sample tensors, {_got(extra)}")
    for name, v in extra.items():
        if not isinstance(name, str) or not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != len(result.y):
            raise BrokenRule(f"{STEP_SAMPLES}; extra[{name!r}] must be a tensor of {len(result.y)} rows (one per "
                             f"sample), {_got(v)}")
    if extra:
        result.extra = extra
    return result


def check_step_gradient(result: Any, grads: Params) -> Params | None:
    return None if result is None else check_params(result, grads, STEP_GRADIENT)


def check_carry_start(result: Any) -> dict:
    if not isinstance(result, dict):
        raise BrokenRule(f"{CARRY_START}; {_got(result)}")
    for key, v in result.items():
        if isinstance(v, dict):
            check_carry_start(v)
        elif not isinstance(v, torch.Tensor):
            raise BrokenRule(f"{CARRY_START}; for '{key}' {_got(v)}")
    return result


def _differing_dims(first: torch.Tensor, v: torch.Tensor, dim: int | None) -> list[int]:
    """The dims along which ``v``'s shape differs from ``first``'s, except the ``ragged`` one (all: another rank)."""
    return [i for i in range(max(v.dim(), first.dim()))
            if v.dim() != first.dim() or (v.shape[i] != first.shape[i] and i != dim)]


def _ragged_dim(path: str, ragged: dict[str, int]) -> int | None:
    return next((d for k, d in ragged.items() if path == k or path.startswith(f"{k}.")), None)


def _refuse_shapes(rule: str, path: str, first: torch.Tensor, v: torch.Tensor, differ: list[int]) -> BrokenRule:
    return BrokenRule(f"{rule}; '{path}' has shape {tuple(first.shape)} for one client and {tuple(v.shape)} for "
                      f"another: give every client the same shape, or declare "
                      f"`computes = Computes(ragged={{{path!r}: {differ[0]}}})` (zero-padded to the widest client in "
                      "the batched engine's stack; each client keeps its own size)")


def check_carries(carries: list[dict], ragged: dict[str, int], prefix: str = "") -> None:
    """Refuse the clients' start carries (one dict per client, each checked by :func:`check_carry_start`)
    whose keys, or tensor shapes along other dims than the method's ``ragged`` declares, differ between clients:
    the batched engine stacks them over the clients."""
    for c in carries[1:]:
        if set(c) != set(carries[0]):
            raise BrokenRule(f"{CARRY_START}; one client's keys are {sorted(carries[0])}, another's {sorted(c)}")
    for key, first in carries[0].items():
        path, leaves = f"{prefix}{key}", [c[key] for c in carries]
        if isinstance(first, dict) or any(isinstance(v, dict) for v in leaves):
            if not all(isinstance(v, dict) for v in leaves):
                raise BrokenRule(f"{CARRY_START}; '{path}' is a dict for one client, not for another")
            check_carries(leaves, ragged, f"{path}.")
            continue
        for v in leaves[1:]:
            differ = _differing_dims(first, v, _ragged_dim(path, ragged))
            if differ:
                raise _refuse_shapes(CARRY_START, path, first, v, differ)


def check_client_states(states: list[dict], ragged: dict[str, int], prefix: str = "") -> None:
    """Refuse the clients' states (what ``client_end`` keeps) whose tensors under one key differ in shape between
    clients along other dims than ``ragged`` declares, where the batched engine stacks them for the hooks it runs
    under ``vmap`` (a client without the key gets zeros: allowed)."""
    keys = list(dict.fromkeys(k for s in states for k in s))
    for key in keys:
        path, leaves = f"{prefix}{key}", [s[key] for s in states if key in s]
        if any(isinstance(v, dict) for v in leaves):
            if not all(isinstance(v, dict) for v in leaves):
                raise BrokenRule(f"{CLIENT_STATE}; '{path}' is a dict for one client, not for another")
            check_client_states(leaves, ragged, f"{path}.")
            continue
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        for v in tensors[1:]:
            differ = _differing_dims(tensors[0], v, _ragged_dim(path, ragged))
            if differ:
                raise _refuse_shapes(CLIENT_STATE, path, tensors[0], v, differ)


def check_carry_step(result: Any, carry: dict, where: str = "") -> dict:
    if not isinstance(result, dict) or set(result) != set(carry):
        keys = sorted(result) if isinstance(result, dict) else None
        raise BrokenRule(f"{CARRY_STEP}; expected keys {sorted(carry)}{where}, "
                         + (f"got keys {keys}" if keys is not None else _got(result)))
    for key, v in carry.items():
        got = result[key]
        if isinstance(v, dict):
            check_carry_step(got, v, f" under '{key}'")
        elif not isinstance(got, torch.Tensor) or got.shape != v.shape or got.dtype != v.dtype:
            raise BrokenRule(f"{CARRY_STEP}; for '{key}' (a {v.dtype} tensor of shape {tuple(v.shape)}) {_got(got)}")
    return result


def check_upload(result: Any) -> Any:
    if result is not None and not isinstance(result, dict):
        raise BrokenRule(f"{UPLOAD}; {_got(result)}")
    return result


def check_none(result: Any, rule: str) -> None:
    if result is not None:
        raise BrokenRule(f"{rule}; {_got(result)}")


def check_params(result: Any, params: Params, rule: str) -> Any:
    if not isinstance(result, dict) or set(result) != set(params):
        missing = sorted(set(params) - set(result)) if isinstance(result, dict) else []
        raise BrokenRule(f"{rule}; {_got(result)}" + (f" without {', '.join(missing)}" if missing else ""))
    for key, p in params.items():
        v = result[key]
        if not isinstance(v, torch.Tensor) or v.shape != p.shape or (
                p.is_floating_point() and not v.is_floating_point()):
            raise BrokenRule(f"{rule}; for '{key}' (shape {tuple(p.shape)}) {_got(v)}")
    return result


def check_some_params(result: Any, params: Params, rule: str) -> Params:
    """None (nothing) or ``{name: tensor}`` for some of ``params``, each shaped and typed like the parameter."""
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise BrokenRule(f"{rule}; {_got(result)}")
    for key, value in result.items():
        p = _parameter(key, params, rule)
        if not isinstance(value, torch.Tensor) or value.shape != p.shape or value.dtype != p.dtype:
            raise BrokenRule(f"{rule}; for '{key}' (a {p.dtype} tensor of shape {tuple(p.shape)}) {_got(value)}")
    return dict(result)


# ---- parameters kept per client (cfl/engine/rounds/client_params.py) ----
NAMES = ("must return ParamRoles(local=, frozen=), each a list of the model's parameter names (a subset of the names "
         "it is given)")
CLIENT_START = "must give as params the client's starting parameters: {every parameter name: tensor shaped like it}"
CLIENT_UPLOAD = ("must return (sent, info): sent {shared parameter name: tensor shaped like it}, info {name: tensor}, "
                 "the same keys and shapes for every client")
SERVER_AGGREGATE = "must return {every name of client_upload's sent: tensor shaped like the parameter}"
BYTES = "must return None (the default) or an int >= 0 (bytes)"


def check_roles(result: Any, names: list[str]) -> tuple[list[str], list[str]]:
    if not isinstance(result, ParamRoles):
        raise BrokenRule(f"{NAMES}; {_got(result)}")
    return check_names(result.local, names, "local"), check_names(result.frozen, names, "frozen")


def check_names(result: Any, names: list[str], role: str) -> list[str]:
    if not isinstance(result, (list, tuple)) or not all(isinstance(n, str) for n in result):
        raise BrokenRule(f"{NAMES}; {role} is {_got(result)}")
    unknown = [n for n in result if n not in names]
    if unknown:
        raise BrokenRule(f"{NAMES}; {role} names {unknown[:3]}, not parameters (the model's: {', '.join(names)})")
    return list(result)


def check_client_start(result: Any, params: Params) -> Params:
    return check_params(result, params, CLIENT_START)


def check_client_upload(result: Any, params: Params, local: frozenset[str]) -> tuple[Params, Params]:
    if not isinstance(result, tuple) or len(result) != 2 or not all(isinstance(r, dict) for r in result):
        raise BrokenRule(f"{CLIENT_UPLOAD}; {_got(result)}")
    sent, info = result
    for key, v in sent.items():
        p = _parameter(key, params, CLIENT_UPLOAD)
        if key in local:
            raise BrokenRule(f"{CLIENT_UPLOAD}; '{key}' is kept per client (param_roles local), never sent")
        if not isinstance(v, torch.Tensor) or v.shape != p.shape or not v.is_floating_point():
            raise BrokenRule(f"{CLIENT_UPLOAD}; for '{key}' (a float tensor of shape {tuple(p.shape)}) {_got(v)}")
    for key, v in info.items():
        if not isinstance(v, torch.Tensor):
            raise BrokenRule(f"{CLIENT_UPLOAD}; info '{key}' {_got(v)}")
    return sent, info


def check_server_aggregate(result: Any, sent: Params, params: Params) -> Params:
    if not isinstance(result, dict) or set(result) != set(sent):
        raise BrokenRule(f"{SERVER_AGGREGATE} ({', '.join(sent)}); {_got(result)}"
                         + (f" with keys {sorted(result)}" if isinstance(result, dict) else ""))
    for key, v in result.items():
        if not isinstance(v, torch.Tensor) or v.shape != params[key].shape or not v.is_floating_point():
            raise BrokenRule(f"{SERVER_AGGREGATE}; for '{key}' (a float tensor of shape {tuple(params[key].shape)}) "
                             f"{_got(v)}")
    return result


def check_bytes(result: Any) -> int | None:
    if result is not None and (isinstance(result, bool) or not isinstance(result, int) or result < 0):
        raise BrokenRule(f"{BYTES}; got {type(result).__name__} {result!r}")
    return result


STEPS_PER_EPOCH = "must give as steps None or an int >= 1 (the local steps of each epoch)"


def check_steps(result: Any) -> int | None:
    if result is not None and (isinstance(result, bool) or not isinstance(result, int) or result < 1):
        raise BrokenRule(f"{STEPS_PER_EPOCH}; {_got(result)}" + (f" {result!r}" if isinstance(result, int) else ""))
    return result
