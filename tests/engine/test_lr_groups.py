"""``lr_groups``: parameters whose names start with a prefix step at their own learning rate, on every path and
optimiser; a prefix that names no parameter is refused, and the stacked path is not taken."""

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from cfl.config.schema import ConfigError
from cfl.engine.local import local_optim
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods, client_schedule
from cfl.engine.local.path import choose_path
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacked_net import StackedNet
from cfl.engine.local.vmap_optim import SGDStep
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores.checkpoint import config_changes
from cfl.methods.base import LocalTraining
from cfl.methods.fedavg import FedAvg
from cfl.models.mlp import MLP
from cfl.ops.losses import masked_cross_entropy
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import make_stream, tiny_config
from tests.run_pairs import assert_batched_equals_sequential

#: centers at 0.5; encoder.w at 0.02 (its longest prefix, not enc's 0.3); other at the top-level lr 0.1
GROUPS = {"centers": 0.5, "enc": 0.3, "encoder.w": 0.02}
LR = 0.1


class ThreeLogits(nn.Module):
    """Logits ``[centers, encoder.w, other]`` for every sample, whatever its input (all 0 at the start)."""

    def __init__(self) -> None:
        super().__init__()
        self.centers = nn.Parameter(torch.zeros(1))
        self.encoder = nn.ParameterDict({"w": nn.Parameter(torch.zeros(1))})
        self.other = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        row = torch.cat([self.centers, self.encoder["w"], self.other])
        return row.expand(x.shape[0], 3)


def _fedavg() -> RoundMethods:
    return RoundMethods([FedAvg(None, None)], [MethodState()], [{}])


def _one_step(hp: Hyper, path: str) -> dict[str, float]:
    """One client, one step on 4 samples of class 0 from all-zero logits: each parameter after the step."""
    model = ThreeLogits()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)
    job = ClientJob(0, torch.arange(4), None, 7)
    if path == "sequential":
        out, _ = train_sequential(model, start, [job], x, y, 0, hp, _fedavg())
    else:
        out, _ = train_batched(model, start, [job], x, y, 0, replace(hp, path=path), _fedavg())
    return {k: float(v[0, 0]) for k, v in out.items()}


@pytest.mark.parametrize("path", ["sequential", "vmap"])
def test_one_sgd_and_one_adam_step_by_hand(path):
    # softmax of zero logits: 1/3 each; the cross-entropy's gradient on class 0: (1/3 - 1, 1/3, 1/3)
    sgd = Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, lr_groups=dict(GROUPS))
    moved = _one_step(sgd, path)
    expected = {"centers": 0.5 * 2 / 3, "encoder.w": -0.02 / 3, "other": -LR / 3}  # p - lr * g, each its own lr
    assert moved == pytest.approx(expected, rel=1e-6)
    # Adam's first step: m / (1 - beta1) = g, sqrt(v / (1 - beta2)) = |g|: each moves by its own lr against g
    adam = _one_step(replace(sgd, optimizer="adam"), path)
    assert adam == pytest.approx({"centers": 0.5, "encoder.w": -0.02, "other": -LR}, rel=1e-6)
    plain = {"centers": LR * 2 / 3, "encoder.w": -LR / 3, "other": -LR / 3}  # the control: lr for all
    assert _one_step(replace(sgd, lr_groups={}), path) == pytest.approx(plain, rel=1e-6)


def test_lr_of_takes_the_longest_prefix():
    hp = Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, lr_groups=dict(GROUPS))
    assert [local_optim.lr_of(hp, k) for k in ("centers", "encoder.w", "encoder.v", "other")] == [0.5, 0.02, 0.3, LR]
    assert local_optim.param_hyper(hp, "other") is hp  # the top-level lr: hp itself
    assert local_optim.param_hyper(hp, "centers").lr == 0.5
    assert LocalTraining({}, 3, LR, dict(GROUPS)).lr_of("encoder.w") == 0.02  # SCAFFOLD's K lr per parameter
    assert LocalTraining({}, 3, LR).lr_of("encoder.w") == LR


@pytest.mark.parametrize("wd", [0.0, 0.1])  # 0.1: the decay folded into one lerp
def test_vmap_sgd_step_of_active_clients_by_hand(wd):
    """The vmap path's SGD step with an ``active`` mask: the active client moves, each parameter by its own lr, to
    ``(1 - lr wd) p - lr g``; the other keeps its parameters."""
    hp = Hyper(lr=LR, momentum=0.0, weight_decay=wd, local_epochs=1, batch_size=4, lr_groups={"centers": 0.5})
    params = {"centers": torch.ones(2, 3), "other": torch.ones(2, 3)}
    step = SGDStep(hp, params, _fedavg())
    g = torch.full((2, 3), 2.0)
    step(0, params, {k: g * step.loss_scale for k in params}, torch.tensor([True, False]), [{}], _fedavg())
    for name, lr in (("centers", 0.5), ("other", LR)):
        assert params[name][0].tolist() == pytest.approx([(1 - lr * wd) - lr * 2.0] * 3, rel=1e-6), name
        assert params[name][1].tolist() == [1.0] * 3, name


@pytest.mark.parametrize(("optimizer", "momentum", "wd"), [("sgd", 0.0, 0.01), ("sgd", 0.9, 0.01), ("adam", 0.0, 0.01),
                                                           ("adamw", 0.0, 0.01)])
@pytest.mark.parametrize("path", ["sequential", "vmap"])
def test_each_path_trains_as_torch_optim_with_param_groups(path, optimizer, momentum, wd):
    """One client, 10 samples at batch 4, two epochs: the parameters equal torch.optim's with one param group per
    prefix (PILoRA's official code: torch.optim.Adam with a group for its centres and one for its encoder)."""
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    groups = {"head": 0.05, "body.1.": 0.002}
    hp = Hyper(lr=0.01, momentum=momentum, weight_decay=wd, local_epochs=2, batch_size=4, optimizer=optimizer,
               lr_groups=groups)
    job = ClientJob(0, torch.arange(10), None, 5)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    ref = copy.deepcopy(model)
    named = dict(ref.named_parameters())
    param_groups = [{"params": [v for k, v in named.items() if local_optim.lr_of(hp, k) == lr], "lr": lr}
                    for lr in (0.05, 0.002, 0.01)]
    kw = {"momentum": momentum} if optimizer == "sgd" else {"betas": hp.betas, "eps": hp.eps}
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer](
        param_groups, lr=hp.lr, weight_decay=wd, **kw)
    for batch in client_schedule(job, hp):
        opt.zero_grad()
        masked_cross_entropy(ref(x[batch], torch.zeros_like(y[batch])), y[batch], None).mean().backward()
        opt.step()
    if path == "sequential":
        out, _ = train_sequential(model, start, [job], x, y, 0, hp, _fedavg())
    else:
        out, _ = train_batched(model, start, [job], x, y, 0, replace(hp, path=path), _fedavg())
    for k, v in named.items():
        assert torch.allclose(out[k][0], v.detach(), atol=1e-6, rtol=1e-5), k
    plain, _ = train_sequential(model, start, [job], x, y, 0, replace(hp, lr_groups={}), _fedavg())
    assert not torch.allclose(plain["head.weight"], out["head.weight"])  # the control: the groups changed it


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_groups_at_the_top_level_lr_change_no_number_on_the_vmap_path(optimizer):
    """Groups whose rate is ``lr`` itself: bit for bit the run without groups (the foreach steps split by rate)."""
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    parts = torch.arange(40).split([13, 9, 18])
    jobs = [ClientJob(c, parts[c], None, 100 + c) for c in range(3)]
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4, optimizer=optimizer,
               path="vmap")
    plain, _ = train_batched(model, start, jobs, x, y, 0, hp, _fedavg())
    same, _ = train_batched(model, start, jobs, x, y, 0, replace(hp, lr_groups={"head": 0.05}), _fedavg())
    assert all(torch.equal(plain[k], same[k]) for k in plain)


SGD_GROUPS = {"head": 0.2, "body.1.": 0.01}  # beside lr 0.05
#: Adam at rates of its own kind: at lr 0.05 and above its sign-like steps grow float32 summation order's 1e-7 into
#: 1e-2 over the run's 6 rounds, with or without groups
ADAM = {"optimizer": {"name": "adam"}, "weight_decay": 0.01, "lr": 0.005}


@pytest.mark.parametrize(("extra", "groups"), [({}, SGD_GROUPS), ({"momentum": 0.9, "weight_decay": 0.01}, SGD_GROUPS),
                                               (ADAM, {"head": 0.01, "body.1.": 0.001})])
def test_batched_equals_sequential_with_lr_groups(extra, groups):
    """digits-mlp on 2 tasks, 4 of 6 clients a round: the batched run (on the vmap path) equals the sequential
    one, and the groups changed the trained model."""
    stream = make_stream("task", num_tasks=2, dim=12)
    runs = [Runner(tiny_config(client_execution=e, lr_groups=groups, **extra), stream)
            for e in ("batched", "sequential")]
    for run in runs:
        run.run()
    assert_batched_equals_sequential(*runs)
    plain = Runner(tiny_config(client_execution="sequential", **extra), stream)
    plain.run()
    assert not torch.allclose(plain.params["head.weight"], runs[1].params["head.weight"])


def test_a_prefix_matching_no_parameter_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"'lr_groups' prefix 'centres' matches no parameter of model MLP, whose "
                                          r"parameter names start with: body, head \(e\.g\. body\.1\.weight"):
        Runner(tiny_config(lr_groups={"head": 0.1, "centres": 2e-3}), make_stream("task", num_tasks=2, dim=12))


@pytest.mark.parametrize(("groups", "words"), [
    ({"": 0.1}, "empty prefix"),
    ({"head": 0}, r"'lr_groups.head' must be > 0"),
    ({"head": "fast"}, r"'lr_groups.head' must be a number"),
    ([0.1], r"'lr_groups' must be a mapping"),
])
def test_bad_groups_are_refused_by_the_config(groups, words):
    with pytest.raises(ConfigError, match=words):
        tiny_config(lr_groups=groups)


def test_the_config_reads_yaml_strings_and_nested_dotted_keys():
    """``2e-3`` (a string to YAML 1.1) is a number; ``--set lr_groups.body.1.=...`` nests, which reads as the dotted
    prefix."""
    cfg = tiny_config(lr_groups={"head": "2e-3", "body": {"1": 0.01}})
    assert cfg.lr_groups == {"head": 0.002, "body.1": 0.01}
    assert from_dict(cfg.to_dict()).lr_groups == cfg.lr_groups


def test_the_stacked_path_is_not_taken_and_says_why():
    model = MLP(6, [5], 3)
    hp = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4)
    assert choose_path(model, hp, [FedAvg(None, None)]).path == "stacked"
    path = choose_path(model, replace(hp, lr_groups={"head": 0.5}), [FedAvg(None, None)])
    reason = "lr_groups gives parameters their own learning rates, which the fused step does not apply"
    assert path.as_dict() == {"path": "vmap", "reason": reason}
    assert path.line() == f"engine: vmap path (reason: {reason})"
    run = Runner(tiny_config(lr_groups={"head": 0.5}), make_stream("task", num_tasks=2, dim=12))
    assert run.engine_path.line() == f"engine: vmap path (reason: {reason})"
    with pytest.raises(ValueError, match="lr_groups"):  # forced onto it, the stacked net refuses
        StackedNet(model, replace(hp, lr_groups={"head": 0.5}))


def test_a_saved_config_from_before_the_key_resumes():
    cfg = tiny_config()
    saved = {k: v for k, v in cfg.to_dict().items() if k != "lr_groups"}
    assert config_changes(saved, cfg) == ""
    changed = config_changes(saved, tiny_config(lr_groups={"head": 0.5}))
    assert changed == "lr_groups.head: None in the checkpoint, 0.5 now"
