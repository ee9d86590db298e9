"""Synthetic samples drawn from the round's broadcast at every local step, with a loss on them through a forward of
their own (TARGET's KD on a synthetic batch, MFCL's loss on generated samples): ``samples``' step part sees
the broadcast (``ctx.server``), ``loss``'s extra part takes the draw (``ctx.samples``), and the step's gradient changes
by the hand-computed amount on both trainers."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_sequential
from cfl.methods.base import Method, RunInfo, Samples
from cfl.methods.fedavg import FedAvg
from cfl.models import ModelShape, build_model
from cfl.plugin import Computes, Draw, LossTerms
from cfl.records.client_states import MethodState

LAM, LR = 0.5, 0.1


class FirstLogit(Method):
    """``LAM`` x the mean over the broadcast pool of the first class's logit, added to every sample's loss."""

    name = "first-logit"
    computes = Computes(losses=("extra",), draws=("step",))

    def samples(self, ctx):
        server = ctx.server
        pool = server["pool"]
        zeros = torch.zeros(len(pool), dtype=torch.long)
        return Draw(step=Samples(pool, zeros, zeros.clone()))

    def loss(self, ctx):
        params, x, samples = ctx.params, ctx.x, ctx.samples
        logits = functional_call(self.run_info.model, params, (samples.x, samples.task))
        term = (logits[:, 0] * samples.weight).sum() / samples.weight.sum()
        return LossTerms(extra=x.new_zeros(x.shape[0]) + LAM * term)


@pytest.mark.parametrize("trainer", [train_sequential, train_batched], ids=["sequential", "batched"])
def test_the_synthetic_loss_moves_the_step_by_its_gradient(trainer):
    """One SGD step (no momentum, no decay) of two clients: against FedAvg, the head's bias moves by
    ``-LR * LAM`` on class 0 only and the head's weight row 0 by ``-LR * LAM * mean_s features(s)``, the gradient
    of ``LAM * mean_s logit_0(s)``; rows 1 and 2 do not move."""
    torch.manual_seed(0)
    model = build_model("digits-mlp", ModelShape((12,), 3, 1, False))
    pool = torch.randn(4, 12)
    x, y = torch.randn(16, 12), torch.arange(16) % 3
    jobs = [ClientJob(0, torch.arange(8), None, 1), ClientJob(1, torch.arange(8, 16), None, 2)]
    hp = Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=8)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    method = FirstLogit(None, RunInfo(1, "domain", 2, 2, 0, model))
    with_pool, _ = trainer(model, start, jobs, x, y, 0, hp, RoundMethods([method], [MethodState()], [{"pool": pool}]))
    plain, _ = trainer(model, start, jobs, x, y, 0, hp, RoundMethods([FedAvg(None, None)], [MethodState()], [{}]))
    with torch.no_grad():
        features = model.body(pool).mean(0)
    for c in range(2):
        bias = with_pool["head.bias"][c] - plain["head.bias"][c]
        assert torch.allclose(bias, torch.tensor([-LR * LAM, 0.0, 0.0]), atol=1e-6)
        weight = with_pool["head.weight"][c] - plain["head.weight"][c]
        assert torch.allclose(weight[0], -LR * LAM * features, atol=1e-6)
        assert torch.allclose(weight[1:], torch.zeros_like(weight[1:]), atol=1e-6)


class Legacy(Method):
    """A plugin reading only part of its contexts (its step draw no ``ctx.server``, its extra loss no
    ``ctx.samples``): it runs unchanged."""

    name = "legacy"
    computes = Computes(losses=("extra",), draws=("step",))

    def samples(self, ctx):
        generator = ctx.generator
        return Draw(step=Samples(torch.randn(2, 12, generator=generator), torch.zeros(2, dtype=torch.long),
                       torch.zeros(2, dtype=torch.long)))

    def loss(self, ctx):
        params, x = ctx.params, ctx.x
        return LossTerms(extra=0.01 * x.pow(2).mean(1) * params["head.bias"].sum())


@pytest.mark.parametrize("trainer", [train_sequential, train_batched], ids=["sequential", "batched"])
def test_a_plugin_without_the_new_arguments_runs_unchanged(trainer):
    torch.manual_seed(0)
    model = build_model("digits-mlp", ModelShape((12,), 3, 1, False))
    x, y = torch.randn(16, 12), torch.arange(16) % 3
    jobs = [ClientJob(0, torch.arange(8), None, 1), ClientJob(1, torch.arange(8, 16), None, 2)]
    hp = Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    trained, outcomes = trainer(model, start, jobs, x, y, 0, hp,
                                RoundMethods([Legacy(None, RunInfo(1, "domain", 2, 2, 0, model))], [MethodState()],
                                             [{}]))
    assert all(o.finite for o in outcomes) and not torch.equal(trained["head.bias"][0], start["head.bias"])


class PoolReplay(Method):
    """Replays the broadcast pool (``samples``' replay part reading ``ctx.server``), labelled class 0."""

    name = "pool-replay"
    computes = Computes(draws=("replay",))

    def samples(self, ctx):
        server = ctx.server
        pool = server["pool"]
        zeros = torch.zeros(len(pool), dtype=torch.long)
        return Draw(replay=Samples(pool, zeros, zeros.clone()))


def test_replay_sees_the_broadcast_on_both_trainers():
    """One SGD step on the batch and the broadcast pool (MFCL's synthetic images join the batch this way): both
    trainers agree, and the step is the plain one on the batch with the pool appended."""
    torch.manual_seed(0)
    model = build_model("digits-mlp", ModelShape((12,), 3, 1, False))
    pool, x, y = torch.randn(4, 12), torch.randn(8, 12), torch.arange(8) % 3
    hp = Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=8)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    method = PoolReplay(None, RunInfo(1, "domain", 1, 1, 0, model))
    round_methods = RoundMethods([method], [MethodState()], [{"pool": pool}])
    runs = [trainer(model, start, [ClientJob(0, torch.arange(8), None, 1)], x, y, 0, hp, round_methods)[0]
            for trainer in (train_sequential, train_batched)]
    joined = torch.cat([x, pool])
    plain, _ = train_sequential(model, start, [ClientJob(0, torch.arange(12), None, 1)], joined,
                                torch.cat([y, torch.zeros(4, dtype=torch.long)]), 0,
                                Hyper(lr=LR, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=12),
                                RoundMethods([FedAvg(None, None)], [MethodState()], [{}]))
    for k in start:
        assert torch.allclose(runs[0][k], runs[1][k], atol=1e-6)
        assert torch.allclose(runs[0][k], plain[k], atol=1e-6)
