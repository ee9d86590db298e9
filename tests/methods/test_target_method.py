"""The registered method ``target``: the client loss through the method against hand values, the task
end producing a pool and an old model, a tiny class-incremental run with its bytes counted, and its refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import RunInfo, Samples
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import LossContext, SamplesContext
from cfl.metrics.results import method_stats
from cfl.models import ModelShape, build_model
from cfl.models.buffers import running_stats
from tests.conftest import METHOD_SETTINGS, method_spec, stream_for, tiny_config

MODEL = "resnet18-reduced-running-bn"
IMAGE = (1, 16, 16)
L2 = math.log(2)


def method(model, scenario: str = "class", **hp):
    cls = METHODS["target"]
    return cls(cls.Hyperparams(**{**METHOD_SETTINGS["target"], **hp}), RunInfo(2, scenario, 2, 2, 0, model,
                                                                               input_shape=IMAGE))


def resnet():
    torch.manual_seed(0)
    return build_model(MODEL, ModelShape(IMAGE, 4, 2, False))


def test_the_client_loss_is_new_class_ce_plus_kd_times_old_class_soft_ce():
    """All-zero student: every logit 0. CE over the 2 new classes of 4: ln 2 per sample; the old classes' soft CE
    of any teacher against a uniform student over 2 classes: ln 2 per synthetic sample; kd 25: 25 ln 2 on every
    entry."""
    model = resnet()
    target = method(model, kd=25.0)
    zero = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    old = {**{k: v.detach().clone() for k, v in model.named_parameters()}, **running_stats(model)}
    server = {"old_model": old, "old_classes": torch.tensor([True, True, False, False])}
    x, y = torch.randn(3, *IMAGE), torch.tensor([2, 3, 2])
    logits = torch.zeros(3, 4)
    allowed = torch.ones(4, dtype=torch.bool)  # the seen classes
    ce = target.loss(LossContext("task", zero, x, torch.zeros(3, dtype=torch.long), torch.ones(3), server, {},
                                 logits=logits, y=y, allowed=allowed)).task
    assert torch.allclose(ce, torch.full((3,), L2))
    samples = Samples(torch.randn(5, *IMAGE), torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                      torch.ones(5))
    kd = target.loss(LossContext("extra", zero, x, torch.zeros(3, dtype=torch.long), torch.ones(len(x)), server, {},
                                 samples)).extra
    assert torch.allclose(kd, torch.full((3,), 25 * L2), rtol=1e-5)
    # task 0 (no teacher yet): all allowed classes, no KD
    assert torch.allclose(target.loss(LossContext("task", zero, x, None, None, {}, {}, logits=logits, y=y,
                                                  allowed=allowed)).task, torch.full((3,), 2 * L2))
    assert torch.equal(target.loss(LossContext("extra", zero, x, torch.zeros(3, dtype=torch.long), torch.ones(len(x)),
                                               {}, {}, None)).extra, torch.zeros(3))


def test_the_kd_term_is_the_soft_ce_of_the_teacher_over_the_old_classes_only():
    """A trained-looking student against the teacher: the method's term equals the hand formula
    ``-sum_old softmax(t/2) log softmax(s/2)`` over the old columns, averaged over the synthetic batch."""
    model = resnet()
    target = method(model, kd=3.0)
    student = {k: v.detach().clone() + 0.05 for k, v in model.named_parameters()}
    old = {**{k: v.detach().clone() for k, v in model.named_parameters()}, **running_stats(model)}
    mask = torch.tensor([True, False, True, False])
    xs = torch.randn(6, *IMAGE)
    samples = Samples(xs, torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long), torch.ones(6))
    got = target.loss(LossContext("extra", student, torch.zeros(2, *IMAGE), torch.zeros(2, dtype=torch.long),
                                  torch.ones(len(torch.zeros(2, *IMAGE))), {"old_model": old,
                                                                            "old_classes": mask}, {}, samples)).extra
    with torch.no_grad():
        s = torch.func.functional_call(model.train(), {**student, **running_stats(model)},
                                       (xs, torch.zeros(6, dtype=torch.long)))[:, mask]
        t = model.eval()(xs, torch.zeros(6, dtype=torch.long))[:, mask]
    want = -(torch.softmax(t / 2, -1) * torch.log_softmax(s / 2, -1)).sum(-1).mean()
    assert torch.allclose(got, torch.full((2,), 3.0 * float(want)), rtol=1e-5)


@pytest.mark.parametrize(("warmup", "adversarial", "distilled"), [(1, 2, 1), (20, 0, 0)], ids=["paper", "preset"])
def test_the_task_end_leaves_a_pool_an_old_model_and_the_seen_classes(warmup, adversarial, distilled):
    """2 synthesis rounds; warm-up 1: the adversarial term in rounds >= 1, the student distilled after round 2
    only; the preset's warm-up 20 (above its round count) reaches neither (its quirk)."""
    model = resnet().eval()
    target = method(model, warmup=warmup)
    server: dict = {}
    target.server_event(ServerEvent("before_task_end", server, 0, {}, model=model, classes=torch.tensor([0, 1])))
    pool = server["pool"]
    assert pool.dtype == torch.uint8 and pool.shape == (8, *IMAGE)  # 2 rounds of 4 images, capacity 8
    assert server["old_classes"].tolist() == [True, True, False, False]
    assert set(server["old_model"]) == {*dict(model.named_parameters()), *running_stats(model)}
    stats = server["stats"]
    assert stats["pool_images"] == 8 and stats["synthesis_seconds"] > 0
    assert stats["adversarial_rounds"] == adversarial and stats["distillation_rounds"] == distilled
    assert (stats["student_seconds"] > 0) == (distilled > 0)
    again: dict = {}
    target.server_event(ServerEvent("before_task_end", again, 0, {}, model=model, classes=torch.tensor([0, 1])))
    assert torch.equal(again["pool"], pool)  # the same draws (a resumed run's pool)
    drawn = target.samples(SamplesContext("step", {}, torch.Generator().manual_seed(0), server, {})).step
    assert drawn.x.shape == (3, *IMAGE)


def test_a_tiny_class_incremental_run_ships_the_pool_and_the_teacher_once_per_client_and_task():
    cfg = tiny_config(num_clients=3, clients_per_round=3, rounds_per_task=2, method=method_spec("target"))
    runner = Runner(cfg, stream_for("target", num_tasks=2, n_train=24, n_test=6))
    runner.run()
    server = runner.states[0].server
    teacher = sum(v.numel() * v.element_size() for v in server["old_model"].values())
    shipped = 8 * 256 + teacher + 6  # pool (uint8), parameters and statistics, the class mask (bool)
    assert runner.comm.lines["task_start.target"] == 3 * shipped
    stats = method_stats(runner.comm, runner.methods[0], runner.states[0])
    assert stats["task_start_download_bytes"] == 3 * shipped and stats["synthesis_seconds"] > 0
    assert stats["before_task_end_seconds"] >= stats["synthesis_seconds"]
    assert all(math.isfinite(a) for row in runner.progress.acc_matrix for a in row if a is not None)


@pytest.mark.parametrize(("scenario", "model", "match"), [
    ("task", MODEL, "class-incremental only"),
    ("class", "digits-mlp", "set model.name: resnet18-reduced-running-bn"),
])
def test_other_scenarios_and_models_without_running_statistics_are_refused(scenario, model, match):
    cfg = tiny_config(method=method_spec("target"))
    stream = stream_for("target", num_tasks=2)
    stream.scenario = scenario
    with pytest.raises(ConfigError, match=match):
        Runner(replace(cfg, model=replace(cfg.model, name=model)), stream)


def test_a_synthetic_batch_is_drawn_from_the_pool_and_normalised_as_the_stream():
    """augment off: each drawn image is ``(pixel / 255 - mean) / std`` of a distinct pool image (the uint8 value
    ``i`` fills image ``i``, so the draw is read back from the values)."""
    model = resnet()
    target = method(model, augment=False, image_mean=[0.5], image_std=[0.25], synthetic_batch=3)
    pool = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, *IMAGE).contiguous()
    server = {"pool": pool, "old_model": dict(model.named_parameters())}
    drawn = target.samples(SamplesContext("step", {}, torch.Generator().manual_seed(0), server, {})).step
    values = drawn.x.flatten(1)
    assert torch.equal(values, values[:, :1].expand_as(values))  # whole images, not mixed
    ids = (values[:, 0] * 0.25 + 0.5) * 255
    assert torch.allclose(ids, ids.round(), atol=1e-4) and len(set(ids.round().tolist())) == 3
    assert set(ids.round().tolist()) <= set(range(5))
