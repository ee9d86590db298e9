"""The batched trainer equals the sequential one on every registered model, ragged client sizes included.

Dropout is switched off (p = 0) in these comparisons: the two trainers draw their masks from torch's global
generator in a different order, so with dropout on they train on different masks by design. Without it they
compute the same sums in a different order (stacked/grouped products against one client's), so parameters
agree within float rounding: ``atol=1e-5, rtol=1e-4`` (measured largest differences after the two steps
below: ~1e-8 without BatchNorm, 8e-6 on resnet18-mini, whose batch statistics amplify the rounding).
The end-to-end grid (every model x method, two tasks, aggregation and server optimisers included) runs
in float64, where the same rounding stays far below ``atol=1e-9, rtol=1e-7`` (float32 differed by up
to 2e-3 on resnet18-mini with ER after two tasks; float64 by 5e-16).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from dataclasses import replace
from typing import get_args

import pytest
import torch

from cfl.cross_checks import model_family_error
from cfl.data.stream import Stream
from cfl.engine.local.batched import BatchedTrainer, train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.path import choose_path
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacking import couples_samples
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import PER_CLIENT_HOOKS, ClientStart, Method, Quadratic, RoundTerms, RunInfo, Samples, Sends
from cfl.methods.declarations import StartPart, TermPart
from cfl.methods.fedavg import FedAvg
from cfl.models import MODELS, ModelShape, build_model
from cfl.models.buffers import running_stats
from cfl.models.dropout import Dropout
from cfl.models.mlp import MLP
from cfl.plugin import Computes, Draw, LossTerms
from cfl.pretrained.backbones import is_backbone
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import METHOD_CONFIGS, METHOD_SETTINGS, METHOD_STREAMS, any_method_models, make_stream, method_spec

# the smallest input every registered model takes (the Mini-ImageNet ResNet's stride-2 stem needs 32x32)
IMAGE = (3, 32, 32)


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every dropout layer at p = 0 (an identity in both trainers)."""
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p, m.keep_prob = 0.0, 1.0
    return model


def assert_params_close(a: dict, b: dict) -> None:
    for k in b:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), (k, float((a[k] - b[k]).abs().max()))


@pytest.mark.parametrize("name", any_method_models())
def test_every_model_trains_alike_in_both_engines_with_ragged_clients(name):
    """Client sizes (6, 5) at batch 4: batches 4, 2 and 4, 1, so the batched trainer pads both last steps. A model
    with BatchNorm running statistics: each client's buffers, updated by its training forwards, agree as well."""
    torch.manual_seed(0)
    model = without_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))
    # nothing but parameters and the running statistics to carry (batch-statistics BatchNorm keeps no buffers)
    buffers = running_stats(model)
    assert [k for k, _ in model.named_buffers()] == list(buffers)
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1, buffers), ClientJob(1, torch.arange(6, 11), None, 2, buffers)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    batched, batched_out = train_batched(model, start, jobs, x, y, 1, hp, round_methods)
    sequential, sequential_out = train_sequential(model, start, jobs, x, y, 1, hp, round_methods)
    assert_params_close(batched, sequential)
    for b, s in zip(batched_out, sequential_out, strict=True):
        assert b.buffers.keys() == s.buffers.keys() == buffers.keys()
        assert_params_close(b.buffers, s.buffers)
        # both steps moved the statistics (the mean off its initial zeros), and only the client's own copy
        assert all(int(v) == 2 for k, v in s.buffers.items() if k.endswith("num_batches_tracked"))
        assert all(bool(v.ne(0).any()) for k, v in s.buffers.items() if k.endswith("running_mean"))
    assert all(bool(v.eq(0).all()) for k, v in buffers.items() if k.endswith("running_mean"))


@pytest.mark.parametrize("name", [n for n in any_method_models()
                                  if not couples_samples(build_model(n, ModelShape(IMAGE, 3, 2, True)))])
def test_every_model_trains_alike_in_both_engines_in_bf16_mixed(name):
    """bf16-mixed, ragged clients as above: the two trainers multiply in bfloat16 in a different order and
    grouping, so they agree to bfloat16 rounding: each parameter within 0.25 of its update's norm (measured:
    at most 0.07, mlp; 3e-5 resnet18-reduced and 1e-6 alexnet, whose convolutions take the same bfloat16
    operands in both: before the vmap path cast them explicitly, they ran in float32 there, 0.16 and 0.2).
    BatchNorm nets are left out: batch statistics of 1-4 samples amplify bfloat16 rounding to the size of
    the update itself (measured 1.3 on resnet18-mini; float32 against bf16-mixed differs as much)."""
    torch.manual_seed(0)
    model = without_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1), ClientJob(1, torch.arange(6, 11), None, 2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2,
               precision="bf16-mixed")
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    batched, _ = train_batched(model, start, jobs, x, y, 1, hp, round_methods)
    sequential, _ = train_sequential(model, start, jobs, x, y, 1, hp, round_methods)
    for k in sequential:
        assert batched[k].dtype == torch.float32
        error = float((batched[k] - sequential[k]).norm() / (sequential[k] - start[k]).norm())
        assert error < 0.25, (k, error)


def test_only_batch_norm_models_are_trained_on_unpadded_groups():
    shape = ModelShape(IMAGE, 3, 2, True)
    coupled = {name for name in MODELS if not is_backbone(name) and couples_samples(build_model(name, shape))}
    assert coupled == {"resnet18-mini", "resnet18-reduced-running-bn"}


def test_the_stacked_path_refuses_layers_that_mix_samples():
    """The stacked path pads short batches whatever the model, so it must never take BatchNorm."""
    model = MLP(4, [5], 3)
    hp = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4)
    assert choose_path(model, hp, [FedAvg(None, None)]).path == "stacked"
    model.body.insert(2, torch.nn.BatchNorm1d(5, track_running_stats=False))
    path = choose_path(model, hp, [FedAvg(None, None)])
    assert couples_samples(model) and path.path == "vmap" and "BatchNorm1d" in path.reason



def smallest_image(name: str) -> tuple[int, int, int]:
    """The smallest square RGB input (in steps of 4 pixels) that model ``name`` takes."""
    for size in range(4, 33, 4):
        try:
            with warnings.catch_warnings():  # too small an input can give zero-element layers
                warnings.simplefilter("ignore", UserWarning)
                model = build_model(name, ModelShape((3, size, size), 3, 2, True)).eval()
            model(torch.zeros(2, 3, size, size), torch.zeros(2, dtype=torch.long))
        except (ValueError, RuntimeError):
            continue
        return (3, size, size)
    raise AssertionError(f"model {name} takes no image up to 32x32")


def image_stream(shape: tuple[int, ...], scenario: str = "task") -> Stream:
    """Two tasks of 3 classes, 15 training and 6 test inputs of ``shape`` each (class-dependent blobs), in
    torch's default dtype."""
    flat = make_stream(scenario, n_train=15, n_test=6, dim=int(torch.Size(shape).numel()))
    for task in flat.tasks:
        task.train_x = task.train_x.view(-1, *shape).to(torch.get_default_dtype())
        task.test_x = task.test_x.view(-1, *shape).to(torch.get_default_dtype())
    flat.input_shape = shape
    return flat


@pytest.fixture
def float64_without_dropout():
    """Double precision, so that batch statistics and adaptive server steps (FedAdam divides by the root of
    tiny second moments) cannot blow float32 rounding up past the tolerance; dropout off in every model."""
    with contextlib.ExitStack() as models:
        for name, builder in list(MODELS.items()):
            models.enter_context(MODELS.temporarily(name, lambda shape, b=builder: without_dropout(b(shape)),
                                                    about=MODELS.about(name), replace=True))
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:
            torch.set_default_dtype(before)


def _round_with(runner: Runner, trainer: object, task: int, path: str) -> tuple[dict, list[float]]:
    """Run one round of ``task`` with ``trainer`` on ``path`` from the runner's current state, leaving that state
    as it was; returns the new global parameters (and BatchNorm running statistics) and the accuracies on the tasks
    so far."""
    params, accuracies, _ = _round_and_states_with(runner, trainer, task, path)
    return params, accuracies


def _round_and_states_with(runner: Runner, trainer: object, task: int, path: str,
                           task_end: bool = False) -> tuple[dict, list[float], tuple[list[dict], list[dict], int]]:
    """:func:`_round_with`, also returning the methods' states after the round (their server states, timings in
    ``stats`` left out, and every client's state) and the round's upload bytes; ``task_end``: the task's end
    after the round."""
    saved = copy.deepcopy((runner.params, runner.states, runner.comm, runner.progress, runner.hyper, runner.buffers,
                           runner.buffer_states))
    # the task-start sender's record of what it sent: each replay of the round starts from the same record
    starts = runner.task_starts
    sent = copy.deepcopy((starts._sent, starts._prints, starts._next_round))
    runner.trainer, runner.hyper.path = trainer, path
    runner.run_round(task, 0)
    if task_end:
        runner.task_end(task)
    states = ([{k: v for k, v in st.server.items() if k != "stats"} for st in runner.states],
              [{c: st.clients.get(c) for c in st.clients.ids()} for st in runner.states], runner.comm.upload_bytes)
    out = {**runner.params, **runner.buffers}, runner.evaluate(task), copy.deepcopy(states)
    runner.params, runner.states, runner.comm, runner.progress, runner.hyper, runner.buffers, \
        runner.buffer_states = saved
    starts._sent, starts._prints, starts._next_round = sent
    return out


#: Task-end settings that keep the subspace methods' float64 eigendecompositions small on the conv nets
#: (the task end is computed once, shared by both trainers: only the rounds are compared).
#: (GLFC's small settings and its class-incremental stream: tests/conftest.py METHOD_SETTINGS, METHOD_STREAMS)
CHEAP_TASK_END = {"fot": {"eps": 0.5, "sketch_factor": 0.25, "conv_sketch_factor": 0.25}, "gpm": {"eps": 0.5},
                  **METHOD_SETTINGS}


#: local optimisers besides the default SGD, checked on the MLP (stacked and vmap paths) with every method: the
#: config keys of each (Adam's moments per client, bias correction by each client's own step count)
OPTIMIZERS = {"adam": {"optimizer": {"name": "adam"}, "weight_decay": 0.01}}


@pytest.mark.usefixtures("float64_without_dropout")
@pytest.mark.parametrize(("model", "method", "optimizer"),
                         [(model, method, "sgd") for model in MODELS for method in METHODS
                          if model_family_error(model, [method]) is None  # FedWeIT's nets with FedWeIT only
                          and not is_backbone(model)]  # a backbone's head on features: tests/test_pretrained*.py
                         + [("mlp", method, opt) for opt in OPTIMIZERS for method in METHODS
                            if model_family_error("mlp", [method]) is None])
def test_every_model_and_method_run_alike_end_to_end(model, method, optimizer):
    """A round of each task (aggregation and server hooks included) from the same state with either trainer, and
    with the batched trainer on the vmap path as well where the run takes the stacked one, the real task-end
    state of task 0 in between (computed once). Client sizes (quantity split) are ragged."""
    cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 4,
                     "lr": 0.05, "partition": {"name": "quantity", "beta": 0.5}, **OPTIMIZERS.get(optimizer, {}),
                     "method": {"name": method, **CHEAP_TASK_END.get(method, {})}, "wandb": {"mode": "disabled"},
                     **METHOD_CONFIGS.get(method, {})})
    cfg = replace(cfg, model=replace(cfg.model, name=model))  # on images of its size, not the config's stream
    _assert_rounds_alike(Runner(cfg, image_stream(smallest_image(model),
                                                  METHOD_STREAMS.get(method, {}).get("scenario", "task"))))


@pytest.mark.usefixtures("float64_without_dropout")
@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_glfc_runs_alike_in_both_engines_on_task_and_domain_streams(scenario):
    """GLFC's adaptation (its registry-wide row above runs class-incremental): the second task's rounds train on
    the by-task groups, the memory of the first and the old model, per client under vmap."""
    cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 4, "lr": 0.05,
                     "partition": {"name": "quantity", "beta": 0.5}, "method": method_spec("glfc"),
                     "wandb": {"mode": "disabled"}})
    _assert_rounds_alike(Runner(replace(cfg, model=replace(cfg.model, name="mlp")),
                                image_stream(smallest_image("mlp"), scenario)))


def _assert_rounds_alike(runner: Runner) -> None:
    """A round of each of two tasks from the same state with either trainer (and on the vmap path as well where
    the run takes the stacked one), the real task-end state of task 0 in between."""
    for task in range(2):
        sizes = [len(ix) for ix in runner.schedule.client_indices(task)]
        assert len(set(sizes)) == len(sizes) and any(n % 4 for n in sizes), sizes  # padded short batches
        sequential, sequential_acc = _round_with(runner, train_sequential, task, "sequential")
        # a method that cannot run under vmap (GEM's solver), or step hooks on BatchNorm, train sequentially
        paths = set() if runner.engine_path.path == "sequential" else {runner.engine_path.path, "vmap"}
        assert paths <= {"stacked", "vmap"}
        for path in paths:
            batched, batched_acc = _round_with(runner, BatchedTrainer(), task, path)
            for k in sequential:
                assert torch.allclose(batched[k], sequential[k], atol=1e-9, rtol=1e-7), (k, task, path)
            assert batched_acc == sequential_acc, path
        runner.params = {k: sequential[k] for k in runner.params}
        runner.buffers = {k: sequential[k] for k in runner.buffers}  # BatchNorm running statistics, if any
        if task == 0:
            runner.task_end(0)


# ---- every Method hook, in a variant that reads no state and one that does --------------------------------------

#: the hooks a method may override, read off :class:`Method` itself, so a new hook fails
#: :func:`test_every_hook_has_both_variants` until it has its variants (``count_bytes`` counts bytes outside local
#: training and sizes the client-state store before the run: tests/methods/test_fedweit_engine.py, and ``check`` only
#: validates the config: neither changes a number; the hooks of parameters kept per client send the run to the
#: sequential path, so there is no batched run to compare)
HOOKS = sorted(name for name, v in vars(Method).items()
               if inspect.isfunction(v) and not name.startswith("_") and name != "count_bytes"
               and name not in PER_CLIENT_HOOKS)
# (``server_event("start")`` runs once when the runner is built, before any round, on the server alone: one round
# cannot show it; tests/methods/test_plugin_hook_values.py runs it through both engines. A backbone change at
# ``server_event("task_end")`` changes a pretrained backbone's shared frozen part, which this test's MLP does not
# have (validation refuses it there); tests/methods/test_lorm.py runs LoRM through both engines)

#: what the state-dependent variants read: client 0's state (client 1 has none, so the batched trainer
#: stacks zeros for it where the sequential one hands over ``{}``), and the server state of every variant;
#: ``other``: other values, for the control that the variant reads them
def _client_state(d: int, dim: int, other: bool = False) -> dict:
    return {"w": torch.tensor(0.9 if other else 0.3), "basis": torch.eye(d)[:, (3, 4) if other else (1, 2)],
            "x": torch.linspace(-1, 1, 2 * dim).view(2, dim) * (3 if other else 1),
            "y": torch.tensor([1, 1] if other else [2, 0])}


def _server_state(other: bool = False) -> dict:
    return {"scale": torch.tensor(0.9 if other else 0.6)}


def _first_weight(method: Method) -> tuple[str, int]:
    """The name and input width of the model's first linear layer."""
    return next((k, v.shape[1]) for k, v in method.run_info.model.named_parameters() if v.dim() == 2)


def _zero() -> torch.Tensor:
    return torch.zeros(())


def _input_dim(method: Method) -> int:
    return int(method.run_info.model.body[1].in_features)


#: per hook, (a state-free implementation, a state-dependent one); the state-dependent ones read a missing
#: key as zeros, which is what the batched trainer stacks for a client without it
VARIANTS = {
    "penalty": (
        lambda _self, global_params, _server, _state: {k: Quadratic(0.1, v + 0.01) for k, v in global_params.items()},
        lambda _self, global_params, _server, state: {k: Quadratic(state.get("w", _zero()), v + 0.01)
                                                      for k, v in global_params.items()},
    ),
    "loss": (  # its extra part (the task part: PART_VARIANTS)
        {"computes": Computes(losses=("extra",)), "loss": lambda self, ctx: LossTerms(
            extra=0.05 * ctx.x.flatten(1).pow(2).mean(1) * ctx.params[_first_weight(self)[0]].pow(2).sum())},
        {"computes": Computes(losses=("extra",)), "loss": lambda self, ctx: LossTerms(
            extra=ctx.state.get("w", _zero()) * ctx.x.flatten(1).pow(2).mean(1)
            * ctx.params[_first_weight(self)[0]].pow(2).sum())},
    ),
    "gradient_projection": (
        lambda self, _state: {_first_weight(self)[0]: torch.eye(_first_weight(self)[1])[:, :2].contiguous()},
        lambda self, state: {_first_weight(self)[0]: state["basis"]} if "basis" in state else {},
    ),
    "samples": (  # its replay part (the step part: PART_VARIANTS)
        {"computes": Computes(draws=("replay",)), "samples": lambda self, ctx: Draw(replay=Samples(
            torch.randn(3, _input_dim(self), generator=ctx.generator), torch.randint(0, 3, (3,),
                                                                                     generator=ctx.generator),
            torch.zeros(3, dtype=torch.long)))},
        {"computes": Computes(draws=("replay",)), "samples": lambda _self, ctx: Draw(replay=Samples(
            ctx.state["x"], ctx.state["y"], torch.zeros_like(ctx.state["y"])) if "x" in ctx.state else None)},
    ),
    "client_end": (
        lambda self, ctx: {"norm": ctx.params[_first_weight(self)[0]].norm().reshape(1)},
        lambda self, ctx: _accumulate(ctx.state, ctx.params[_first_weight(self)[0]].sum().reshape(1)),
    ),
    "server_update": (
        lambda _self, c: {k: w + 0.5 * c.server_lr * c.delta[k] for k, w in c.global_params.items()},
        lambda _self, c: {k: w + c.server["scale"] * c.server_lr * c.delta[k] for k, w in c.global_params.items()},
    ),
    "transform_update": (
        lambda _self, c: {k: 0.5 * d for k, d in c.delta.items()},
        lambda _self, c: {k: c.server["scale"] * d for k, d in c.delta.items()},
    ),
}


def _nudged_by(samples_of: str):
    """A ``step_gradient`` adding 0.1 x the loss gradient of some samples: the step's own batch ("batch") or
    the method's step draw ("samples", ``samples``' step part), so that a step hook's ``step.gradient`` is exercised."""
    def step_gradient(_self, step):
        if samples_of == "samples" and step.samples is None:
            return None
        s = step.samples if samples_of == "samples" else step
        ref = step.gradient(s.x, s.y, s.task, s.weight)
        return {k: g + 0.1 * ref[k] for k, g in step.grads.items()}
    return step_gradient


def _terms(part: str, old):
    """A method giving ``round_terms``' ``part`` only, from ``old(self, ...)`` (the old hook's arguments)."""
    def round_terms(self, ctx):
        args = (ctx.global_params, ctx.server, ctx.state) if part == "penalty" else (ctx.state,)
        return RoundTerms(**{part: old(self, *args)})
    return {"computes": Computes(terms=(part,)), "round_terms": round_terms}


def _carrying(old):
    """A method giving ``client_start``'s carry only, from ``old(self, global_params, state)``."""
    return {"computes": Computes(starts=("carry",)),
            "client_start": lambda self, ctx: ClientStart(carry=old(self, ctx.global_params, ctx.state))}


def _path_start(_self, global_params, state):
    return {"path": state.get("path") or {k: torch.zeros_like(v) for k, v in global_params.items()}}



VARIANTS["layer_preconditioner"] = (
    lambda self, _state: {_first_weight(self)[0]: torch.eye(_first_weight(self)[1]) * 0.5
                          + 0.01 * torch.ones(_first_weight(self)[1], _first_weight(self)[1])},
    lambda _self, state: {"body.1.weight": torch.eye(state["basis"].shape[0]) - 0.5 * state["basis"] @ state["basis"].T}
    if "basis" in state else {},
)

#: the step hooks; a hook that changes nothing alone comes with the hook that makes it count
VARIANTS.update({
    "step_gradient": (
        _nudged_by("batch"),
        lambda _self, step: {k: g * (1 + step.state.get("w", _zero())) for k, g in step.grads.items()},
    ),
    "client_start.carry": (
        _carrying(lambda _self, global_params, _state: {"start_norm": sum(v.norm() for v in global_params.values())}),
        _carrying(lambda _self, _global_params, state: {"doubled": 2 * state.get("w", _zero())}),
    ),
    "carry_step": (
        {**_carrying(_path_start),
         "carry_step": lambda _self, step: {"path": {k: p - step.grads[k] * step.moved[k]
                                                     for k, p in step.carry["path"].items()}}},
        {**_carrying(_path_start),
         "carry_step": lambda _self, step: {"path": {k: p + step.state.get("w", _zero()) * step.moved[k]
                                                     for k, p in step.carry["path"].items()}}},
    ),
})


def _server_event(self, ctx, reads: bool) -> None:
    """After the round: the uploads counted and the new model's norm (``reads``: scaled by the server's ``scale``,
    then halved); before the task end (the test runs the task end after the round), the teacher."""
    server, model = ctx.server, ctx.model
    if ctx.event not in ("round", "before_task_end"):  # "start": before the states are seeded
        return
    scale = server["scale"] if reads else 1.0
    if ctx.event == "round":
        server.update(count=torch.tensor(float(len(ctx.uploads))),
                      norm=scale * sum(v.norm() for v in ctx.global_params.values()))
        if reads:
            server.update(scale=server["scale"] * 0.5)
    elif ctx.event == "before_task_end" and not reads:
        server.update(teacher=(sum(p.norm() for p in model.parameters()) + ctx.classes.sum()).detach())
    elif ctx.event == "before_task_end":
        server.update(teacher=scale * model(torch.ones(1, _input_dim(self)),
                                            torch.zeros(1, dtype=torch.long)).detach().sum())


VARIANTS["server_event"] = (
    lambda self, ctx: _server_event(self, ctx, False),
    lambda self, ctx: _server_event(self, ctx, True),
)
TASK_END_HOOKS = ("server_event",)

#: each local epoch cut to its first batches; the state-dependent variant reads the broadcast ``scale``
VARIANTS["client_start.steps"] = (
    {"computes": Computes(starts=("steps",)), "client_start": lambda _self, _ctx: ClientStart(steps=1)},
    {"computes": Computes(starts=("steps",)),
     "client_start": lambda _self, ctx: ClientStart(steps=1 if float(ctx.server["scale"]) < 0.7 else 2),
     "sends": Sends(broadcast={"round": ("scale",)})},
)
#: the parts of the hooks that merge several (``round_terms``; ``client_start``'s but its params, which send the
#: run to the sequential path), each with its variants in place of the hook's
PARTS = {"round_terms.penalty", "round_terms.projection", "round_terms.preconditioner", "client_start.carry",
         "client_start.steps"}
for _old, _part in (("penalty", "penalty"), ("gradient_projection", "projection"),
                    ("layer_preconditioner", "preconditioner")):
    VARIANTS[f"round_terms.{_part}"] = tuple(_terms(_part, v) for v in VARIANTS.pop(_old))


def _synthetic_loss(self, ctx):
    """``loss``'s extra part taking the method's draw (``ctx.samples``): ``scale`` x the weighted mean over the drawn
    samples of their squared logits (a forward of their own), added to every sample of the batch."""
    x, samples = ctx.x, ctx.samples
    if samples is None:
        return LossTerms(extra=x.new_zeros(x.shape[0]))
    logits = torch.func.functional_call(self.run_info.model, ctx.params, (samples.x, samples.task))
    kd = (logits.pow(2).mean(1) * samples.weight).sum() / samples.weight.sum().clamp(min=1)
    return LossTerms(extra=x.new_zeros(x.shape[0]) + ctx.server.get("scale", 0.5) * kd)


def _drawn_with_server(self, ctx):
    """``samples``' step part reading the broadcast: random inputs scaled by its ``scale`` (state-free: none, 1)."""
    scale, generator = ctx.server.get("scale", torch.tensor(1.0)), ctx.generator
    return Draw(step=Samples(scale * torch.randn(3, _input_dim(self), generator=generator),
                             torch.randint(0, 3, (3,), generator=generator), torch.zeros(3, dtype=torch.long)))


def _step_draw(self, ctx):
    """``samples``' step part, state-free: three random samples from the client's generator."""
    generator = ctx.generator
    return Draw(step=Samples(torch.randn(3, _input_dim(self), generator=generator),
                             torch.randint(0, 3, (3,), generator=generator), torch.zeros(3, dtype=torch.long)))


def _step_draw_of_state(_self, ctx):
    """``samples``' step part, state-dependent: the client's stored samples (none without them)."""
    state = ctx.state
    return Draw(step=Samples(state["x"], state["y"], torch.zeros_like(state["y"])) if "x" in state else None)


#: the other part of ``loss`` and ``samples`` (each hook's main variant is of one part), and the newer
#: arguments (the step draw's ``server``, the extra loss's ``samples``), the state-dependent variants reading
#: ``scale`` from the "task_start" broadcast
ARGUMENT_VARIANTS = {
    "loss(task)": (
        {"computes": Computes(losses=("task",)), "loss": lambda _self, ctx: LossTerms(
            task=1.5 * torch.nn.functional.cross_entropy(ctx.logits, ctx.y, reduction="none"))},
        {"computes": Computes(losses=("task",)), "loss": lambda _self, ctx: LossTerms(
            task=(1 + ctx.state.get("w", _zero())) * torch.nn.functional.cross_entropy(ctx.logits, ctx.y,
                                                                                       reduction="none"))},
    ),
    "samples(step)": (
        {"computes": Computes(draws=("step",)), "samples": _step_draw, "step_gradient": _nudged_by("samples")},
        {"computes": Computes(draws=("step",)), "samples": _step_draw_of_state, "step_gradient": _nudged_by("samples")},
    ),
    "loss(samples)": (
        {"computes": Computes(losses=("extra",), draws=("step",)), "samples": _step_draw, "loss": _synthetic_loss},
        {"sends": Sends(broadcast={"task_start": ("scale",)}), "computes": Computes(losses=("extra",), draws=("step",)),
         "samples": _step_draw_of_state, "loss": _synthetic_loss},
    ),
    "samples(server)": (
        {"computes": Computes(losses=("extra",), draws=("step",)), "samples": _drawn_with_server,
         "loss": _synthetic_loss},
        {"sends": Sends(broadcast={"task_start": ("scale",)}), "computes": Computes(draws=("step",)),
         "samples": _drawn_with_server,
         "step_gradient": _nudged_by("samples")},
    ),
}
VARIANTS.update(ARGUMENT_VARIANTS)


def _accumulate(state: dict, value: torch.Tensor) -> dict:
    """``state["sum"] += value`` (from 0), uploading the new sum."""
    state["sum"] = state.get("sum", torch.zeros(1)) + value
    return {"sum": state["sum"].clone()}


def test_every_hook_has_both_variants():
    assert sorted(set(VARIANTS) - set(ARGUMENT_VARIANTS) - PARTS) == [h for h in HOOKS if h != "round_terms"]
    assert {p.split(".")[1] for p in PARTS} == {*get_args(TermPart), *get_args(StartPart)} - {"params"}
    assert len(HOOKS) == 9  # of the 14: count_bytes and the four of parameters kept per client left out


def _assert_states_close(a: object, b: object, where: str) -> None:
    if isinstance(b, dict):
        assert isinstance(a, dict) and sorted(a) == sorted(b), (where, a, b)
        for k in b:
            _assert_states_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, list | tuple):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _assert_states_close(u, v, f"{where}[{i}]")
    elif isinstance(b, torch.Tensor):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-7), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.usefixtures("float64_without_dropout")
@pytest.mark.parametrize("variant", ["state-free", "state-dependent"])
@pytest.mark.parametrize("hook", sorted(VARIANTS))
def test_every_hook_runs_alike_in_both_engines(hook, variant):
    """A method overriding ``hook`` alone, in a variant that holds and reads no state and one that reads its
    state (client 0 holds a client state, client 1 none; the server holds one): one round gives the same
    global model, states and upload bytes with the sequential trainer and with the batched one on every path
    the run can take. (The batched trainer once skipped a gradient projection whenever no client held state,
    so a state-free one was never applied.)"""
    impl = VARIANTS[hook][variant == "state-dependent"]
    name = f"hook-{hook.replace('_', '-').replace('(', '-').replace('.', '-').rstrip(')')}-{variant}"
    cls = type(name, (Method,), {"name": name, **(impl if isinstance(impl, dict) else {hook: impl})})
    with METHODS.temporarily(name, cls):
        cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 4,
                         "lr": 0.05, "weight_decay": 0.01, "partition": {"name": "quantity", "beta": 0.5},
                         "method": {"name": name}, "wandb": {"mode": "disabled"}})
        runner = Runner(cfg, make_stream("task", n_train=15, n_test=6))
        if variant == "state-dependent":  # the state-free variant runs with no state at all
            _seed_states(runner, other=False)
        task_end = hook in TASK_END_HOOKS
        sequential = _round_and_states_with(runner, train_sequential, 0, "sequential", task_end)
        for path in {runner.engine_path.path, "vmap"}:
            batched = _round_and_states_with(runner, BatchedTrainer(), 0, path, task_end)
            for k in sequential[0]:
                assert torch.allclose(batched[0][k], sequential[0][k], atol=1e-9, rtol=1e-7), (k, path)
            assert batched[1] == sequential[1], path
            _assert_states_close(batched[2], sequential[2], path)
        # the control: the hook changes the round (state-free: against no hook), and reads its state
        if variant == "state-free":
            runner.methods[0] = Method(None, runner.run_info)
        else:
            _seed_states(runner, other=True)
        control = _round_and_states_with(runner, train_sequential, 0, "sequential", task_end)
        assert _round_differs(control, sequential)


def _seed_states(runner: Runner, other: bool) -> None:
    method = runner.methods[0]
    runner.states[0].clients.put(0, _client_state(_first_weight(method)[1], _input_dim(method), other))
    runner.states[0].server.update(_server_state(other))


def _round_differs(a: tuple, b: tuple) -> bool:
    """Whether two rounds' outcomes (:func:`_round_and_states_with`) differ in a parameter, a state or the
    upload bytes."""
    try:
        for k in b[0]:
            assert torch.equal(a[0][k], b[0][k])
        _assert_states_close(a[2], b[2], "")
    except AssertionError:
        return True
    return False


class _DrawsRagged(Method):
    """A synthetic batch of 1-3 samples per client and step (the client's generator decides), whose loss has a
    forward of its own (TARGET's KD on a synthetic batch)."""

    name = "draws-ragged"
    computes = Computes(losses=("extra",), draws=("step",))

    def samples(self, ctx):
        generator = ctx.generator
        k = int(torch.randint(1, 4, (1,), generator=generator))
        return Draw(step=Samples(torch.randn(k, *IMAGE, generator=generator), torch.zeros(k, dtype=torch.long),
                       torch.ones(k, dtype=torch.long)))

    def loss(self, ctx):
        params, x, samples = ctx.params, ctx.x, ctx.samples
        logits = torch.func.functional_call(self.run_info.model, params, (samples.x, samples.task))
        mean = (logits.pow(2).mean(1) * samples.weight).sum() / samples.weight.sum()
        return LossTerms(extra=x.new_zeros(x.shape[0]) + 0.1 * mean)


def test_drawn_samples_reach_the_extra_loss_unpadded_on_batch_norm():
    """On a BatchNorm model a step draw that only ``loss``'s extra part reads keeps the run on the vmap path, whose
    losses run per group of clients with equal batch and draw sizes (padding would enter the batch statistics): the
    same parameters as the sequential trainer, with ragged draws (1-3 samples) and ragged batches (6, 5 at 4)."""
    torch.manual_seed(0)
    model = build_model("resnet18-mini", ModelShape(IMAGE, 3, 2, True))
    method = _DrawsRagged(None, RunInfo(2, "task", 2, 2, 0, model))
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2)
    assert choose_path(model, hp, [method]).path == "vmap"
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1), ClientJob(1, torch.arange(6, 11), None, 2)]
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([method], [MethodState()], [{}])
    batched, _ = train_batched(model, start, jobs, x, y, 1, hp, round_methods)
    sequential, _ = train_sequential(model, start, jobs, x, y, 1, hp, round_methods)
    assert_params_close(batched, sequential)
    plain, _ = train_sequential(model, start, jobs, x, y, 1, hp,
                                RoundMethods([FedAvg(None, None)], [MethodState()], [{}]))
    assert any(not torch.allclose(plain[k], sequential[k], atol=1e-4) for k in plain)  # the loss counts
