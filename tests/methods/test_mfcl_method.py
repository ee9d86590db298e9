"""The MFCL method: one client's loss through the method's hooks equals the building block's
(tests/methods/test_mfcl_losses.py checks that against hand values), a task end trains a generator that lowers its
objective, and a tiny class-incremental run ships the generator and the old model once per client and task, counted."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import RunInfo
from cfl.methods.mfcl import MFCL, MFCLHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import LossContext, SamplesContext
from cfl.metrics.results import method_stats
from cfl.models import ModelShape, build_model
from cfl.models.buffers import running_stats
from cfl.ops.bn_statistics import gaussian_statistics_loss, recording_batch_statistics
from cfl.ops.data_free_clients import ClassSets, mfcl_client_loss
from cfl.ops.losses import masked_cross_entropy
from cfl.ops.mfcl_losses import MfclWeights, gaussian_kernel, generator_objective
from cfl.ops.synthesis import frozen_eval
from tests.conftest import METHOD_SETTINGS, stream_for, tiny_config

IMAGE = (1, 12, 12)
SMALL = MFCLHyperparams(**METHOD_SETTINGS["mfcl"])


def _model(seed: int) -> torch.nn.Module:
    """The running-stat ResNet (6 classes, one head) with running statistics moved off their initial values."""
    torch.manual_seed(seed)
    model = build_model("resnet18-reduced-running-bn", ModelShape(IMAGE, 6, 2, False))
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, *IMAGE) + 0.5, torch.zeros(16, dtype=torch.long))
    return model.eval()


def _method(model: torch.nn.Module, hparams: MFCLHyperparams = SMALL) -> MFCL:
    return MFCL(hparams, RunInfo(2, "class", 3, 3, 0, model, input_shape=IMAGE))


def _task_end(method: MFCL, old: torch.nn.Module) -> dict:
    server: dict = {}
    method.server_event(ServerEvent("before_task_end", server, 0, {}, model=old, classes=torch.tensor([0, 1, 2])))
    return server


def test_the_client_loss_through_the_hooks_equals_the_building_block():
    """Task 1 (old classes 0-2, new 3-5): the mean of ``loss``'s task part over the real batch and the replay draw, in
    one training-mode forward as the engine runs it, and its gradient, equal ``mfcl_client_loss`` (the official
    code's one forward of real and synthetic samples) on the same samples."""
    old, model = _model(0), _model(1)
    method = _method(model, MFCLHyperparams(**{**METHOD_SETTINGS["mfcl"], "w_kd": 0.7, "w_ft": 0.4}))
    server = _task_end(method, old)
    drawn = method.samples(SamplesContext("replay", {}, torch.Generator().manual_seed(3), server, {})).replay
    assert drawn is not None and drawn.x.shape == (4, *IMAGE) and set(drawn.y.tolist()) <= {0, 1, 2}
    x, y = torch.randn(6, *IMAGE), torch.tensor([3, 4, 5, 3, 4, 5])
    x_all, y_all = torch.cat([x, drawn.x]), torch.cat([y, drawn.y])
    task = torch.ones(len(y_all), dtype=torch.long)
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    model.train()
    logits = functional_call(model, {**params, **running_stats(model)}, (x_all, task))  # the engine's forward
    seen = torch.ones(6, dtype=torch.bool)
    ours = method.loss(LossContext("task", params, x_all, task, torch.ones(len(y_all)), server, {}, logits=logits,
                                   y=y_all, allowed=seen)).task.mean()
    old_classes = torch.tensor([True, True, True, False, False, False])
    theirs = mfcl_client_loss(model, {**params, **running_stats(model)}, server["old_model"], x, y, drawn.x,
                              ClassSets(~old_classes, old_classes), 1, w_ft=0.4, w_kd=0.7)
    assert torch.allclose(ours, theirs["total"], rtol=1e-5)
    assert float(theirs["kd"].detach()) > 0 and float(theirs["ft"].detach()) > 0  # every term is in it
    for a, b in zip(torch.autograd.grad(ours, list(params.values())),
                    torch.autograd.grad(theirs["total"], list(params.values())), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), float((a - b).abs().max())


def test_task_zero_is_the_cross_entropy_and_draws_nothing():
    model = _model(0)
    method = _method(model)
    assert method.samples(SamplesContext("replay", {}, torch.Generator().manual_seed(0), {}, {})) is None
    logits, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    allowed = torch.tensor([True, True, True, False, False, False])
    out = method.loss(LossContext("task", {}, torch.zeros(5, *IMAGE), torch.zeros(5, dtype=torch.long), torch.ones(5),
                                  {}, {}, logits=logits, y=y, allowed=allowed)).task
    assert torch.equal(out, masked_cross_entropy(logits, y, allowed))


def _objective(generator: torch.nn.Module, teacher: torch.nn.Module, z: torch.Tensor) -> float:
    """The generator objective (official weights) on the noise ``z``, the generator in training mode."""
    with torch.no_grad(), frozen_eval(teacher), recording_batch_statistics(teacher) as layers:
        images = generator.train()(z)
        logits = teacher(images, torch.zeros(len(z), dtype=torch.long))[:, :3]
        return float(generator_objective(logits, gaussian_statistics_loss(layers), images, gaussian_kernel(),
                                         MfclWeights())["total"])


def test_a_task_end_trains_a_generator_that_lowers_its_objective():
    old = _model(0)
    method = _method(old, MFCLHyperparams(**{**METHOD_SETTINGS["mfcl"], "generator_steps": 30,
                                             "generator_batch": 16, "generator_lr": 0.01}))
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(5))
    before = _objective(method.new_generator(), old, z)
    server = _task_end(method, old)
    trained = method.new_generator()
    trained.load_state_dict(server["generator"])
    assert _objective(trained, old, z) < 0.9 * before
    stats = server["stats"]
    assert stats["generator_steps"] == 30 and stats["generator_seconds"] > 0
    # the old model: the task's final global model with its running statistics
    assert all(torch.equal(server["old_model"][k], v) for k, v in {**dict(old.named_parameters()),
                                                                  **running_stats(old)}.items())
    assert server["old_classes"].tolist() == [True, True, True, False, False, False]


def test_a_tiny_class_incremental_run_ships_the_generator_and_old_model_once_per_client_and_task():
    cfg = tiny_config(method={"name": "mfcl", **METHOD_SETTINGS["mfcl"]}, rounds_per_task=2, num_clients=3,
                      clients_per_round=3, threads=1)
    runner = Runner(cfg, stream_for("mfcl", num_tasks=2))
    runner.run()
    state = runner.states[0]
    stats = method_stats(runner.comm, runner.methods[0], state)
    assert runner.engine_path.path == "sequential"
    assert stats["generator_steps"] == 2 and stats["generator_seconds"] > 0 and stats["before_task_end_seconds"] > 0
    payload = [state.server["old_classes"], *state.server["generator"].values(), *state.server["old_model"].values()]
    one_copy = sum(t.numel() * t.element_size() for t in payload)
    assert stats["task_start_download_bytes"] == 3 * one_copy  # 3 clients in task 1, once each; none in task 0
    assert all(a is not None for a in runner.progress.acc_matrix[1])


@pytest.mark.parametrize(("scenario", "shape"), [("task", IMAGE), ("class", (12,)), ("class", (1, 10, 10))])
def test_other_scenarios_and_inputs_are_refused(scenario, shape):
    model = _model(0)
    with pytest.raises(ConfigError, match="class-incremental|square images"):
        MFCL(SMALL, RunInfo(2, scenario, 3, 3, 0, model, input_shape=shape))
