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
import warnings
from dataclasses import replace

import pytest
import torch

from cfl.data.stream import Stream
from cfl.engine.jobs import ClientJob, Hyper, Plugins
from cfl.engine.local_batched import BatchedTrainer, couples_samples, train_batched
from cfl.engine.local_sequential import train_sequential
from cfl.engine.path import choose_path
from cfl.engine.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import MethodState
from cfl.methods.fedavg import FedAvg
from cfl.models import MODELS, ModelShape, build_model
from cfl.models.dropout import Dropout
from cfl.models.mlp import MLP
from cfl.validation import from_dict
from tests.conftest import make_stream

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


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_trains_alike_in_both_engines_with_ragged_clients(name):
    """Client sizes (6, 5) at batch 4: batches 4, 2 and 4, 1, so the batched trainer pads both last steps."""
    torch.manual_seed(0)
    model = without_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))
    assert not list(model.buffers())  # nothing but parameters to average (BatchNorm: batch statistics only)
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1), ClientJob(1, torch.arange(6, 11), None, 2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    plugins = Plugins([FedAvg(None, None)], [MethodState()], [{}])
    batched, _ = train_batched(model, start, jobs, x, y, 1, hp, plugins)
    sequential, _ = train_sequential(model, start, jobs, x, y, 1, hp, plugins)
    assert_params_close(batched, sequential)


@pytest.mark.parametrize("name", [n for n in MODELS
                                  if not couples_samples(build_model(n, ModelShape(IMAGE, 3, 2, True)))])
def test_every_model_trains_alike_in_both_engines_in_bf16_mixed(name):
    """bf16-mixed, ragged clients as above: the two trainers multiply in bfloat16 in a different order and
    grouping, so they agree to bfloat16 rounding: each parameter within 0.25 of its update's norm (measured:
    at most 0.16, resnet18-reduced; 0.07 mlp, 0.04 alexnet). BatchNorm nets are left out: batch statistics
    of 1-4 samples amplify bfloat16 rounding to the size of the update itself (measured 1.3 on
    resnet18-mini; float32 against bf16-mixed differs as much)."""
    torch.manual_seed(0)
    model = without_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1), ClientJob(1, torch.arange(6, 11), None, 2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2,
               precision="bf16-mixed")
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    plugins = Plugins([FedAvg(None, None)], [MethodState()], [{}])
    batched, _ = train_batched(model, start, jobs, x, y, 1, hp, plugins)
    sequential, _ = train_sequential(model, start, jobs, x, y, 1, hp, plugins)
    for k in sequential:
        assert batched[k].dtype == torch.float32
        error = float((batched[k] - sequential[k]).norm() / (sequential[k] - start[k]).norm())
        assert error < 0.25, (k, error)


def test_only_batch_norm_models_are_trained_on_unpadded_groups():
    shape = ModelShape(IMAGE, 3, 2, True)
    coupled = {name for name in MODELS if couples_samples(build_model(name, shape))}
    assert coupled == {"resnet18-mini"}


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
    as it was; returns the new global parameters and the accuracies on the tasks so far."""
    saved = copy.deepcopy((runner.params, runner.states, runner.comm, runner.progress, runner.hyper))
    runner.trainer, runner.hyper.path = trainer, path
    runner.run_round(task, 0)
    out = runner.params, runner.evaluate(task)
    runner.params, runner.states, runner.comm, runner.progress, runner.hyper = saved
    return out


#: Task-end settings that keep the subspace methods' float64 eigendecompositions small on the conv nets
#: (the task end is computed once, shared by both trainers: only the rounds are compared).
CHEAP_TASK_END = {"fot": {"eps": 0.5, "sketch_factor": 0.25, "conv_sketch_factor": 0.25}, "gpm": {"eps": 0.5}}


@pytest.mark.usefixtures("float64_without_dropout")
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_and_method_run_alike_end_to_end(model, method):
    """A round of each task (aggregation and server hooks included) from the same state with either trainer, and
    with the batched trainer on the vmap path as well where the run takes the stacked one, the real task-end
    state of task 0 in between (computed once). Client sizes (quantity split) are ragged."""
    cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 4,
                     "lr": 0.05, "partition": {"name": "quantity", "beta": 0.5},
                     "method": {"name": method, **CHEAP_TASK_END.get(method, {})}, "wandb": {"mode": "disabled"}})
    cfg = replace(cfg, model=replace(cfg.model, name=model))  # on images of its size, not the config's stream
    runner = Runner(cfg, image_stream(smallest_image(model)))
    for task in range(2):
        sizes = [len(ix) for ix in runner.schedule.client_indices(task)]
        assert len(set(sizes)) == len(sizes) and any(n % 4 for n in sizes), sizes  # padded short batches
        sequential, sequential_acc = _round_with(runner, train_sequential, task, "sequential")
        paths = {runner.engine_path.path, "vmap"}
        assert paths <= {"stacked", "vmap"}
        for path in paths:
            batched, batched_acc = _round_with(runner, BatchedTrainer(), task, path)
            for k in sequential:
                assert torch.allclose(batched[k], sequential[k], atol=1e-9, rtol=1e-7), (k, task, path)
            assert batched_acc == sequential_acc, path
        runner.params = sequential
        if task == 0:
            runner.task_end(0)
