"""The batched trainer's two paths, each called on its own: the stacked path (``local_stacked.train_stacked``) and
the vmap path (``local_vmap.train_vmap``) train the same sorted clients as the sequential trainer, in one block
and in blocks of one; the stacked path refuses step hooks before it allocates anything."""

from __future__ import annotations

import pytest
import torch

from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacked import train_stacked
from cfl.engine.local.vmap import train_vmap
from cfl.methods.base import Step
from cfl.methods.fedavg import FedAvg
from cfl.models.mlp import MLP
from cfl.records.client_states import MethodState


def _setup():
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    perm = torch.randperm(40)
    jobs = [ClientJob(c, part, None, 100 + c) for c, part in enumerate((perm[:18], perm[18:31], perm[31:]))]
    hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return model, params, jobs, x, y, hp  # jobs sorted by size, most first, as train_batched hands them


@pytest.mark.parametrize("block", [3, 1])
@pytest.mark.parametrize("path", ["stacked", "vmap"])
def test_each_path_on_its_own_matches_the_sequential_trainer(path, block):
    model, params, jobs, x, y, hp = _setup()
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    if path == "stacked":
        got, outcomes = train_stacked(model, params, jobs, x, y, 0, hp, round_methods, block, {})
    else:
        got, outcomes = train_vmap(model, params, jobs, x, y, 0, hp, round_methods, block)
    ref, ref_outcomes = train_sequential(model, params, jobs, x, y, 0, hp, round_methods)
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=1e-5), k
    assert [o.steps for o in outcomes] == [o.steps for o in ref_outcomes] == [10, 8, 6]
    assert [o.mean_loss for o in outcomes] == pytest.approx([o.mean_loss for o in ref_outcomes], rel=1e-5)


def test_stacked_path_refuses_step_hooks_before_any_work():
    class Rewriting(FedAvg):
        name = "rewriting"

        def step_gradient(self, step: Step):
            return step.grads

    model, params, jobs, x, y, hp = _setup()
    workspace = {}
    round_methods = RoundMethods([Rewriting(None, None)], [MethodState()], [{}])
    with pytest.raises(ValueError, match="the stacked path takes no step hooks"):
        train_stacked(model, params, jobs, x, y, 0, hp, round_methods, 3, workspace)
    assert workspace == {}
