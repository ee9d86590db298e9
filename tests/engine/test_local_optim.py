"""Local optimisers: SGD with momentum, Adam and AdamW, the same step on every training path."""

import copy
from dataclasses import replace

import pytest
import torch

from cfl.engine.local import local_optim
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods, client_schedule
from cfl.engine.local.path import choose_path
from cfl.engine.local.sequential import train_sequential
from cfl.methods.fedavg import FedAvg
from cfl.methods.fedprox import FedProx, FedProxHyperparams
from cfl.models.mlp import MLP
from cfl.ops.losses import masked_cross_entropy
from cfl.records.client_states import MethodState

ADAM = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, optimizer="adam")


def _two_steps(hp: Hyper) -> list[float]:
    """``p`` (from 1.0) after each of two steps with gradients 2 then -1."""
    p = torch.tensor([1.0], dtype=torch.float64)
    slots = local_optim.new_slots(hp, p)
    out = []
    for t, g in enumerate((2.0, -1.0), 1):
        local_optim.step_(hp, p, torch.tensor([g], dtype=torch.float64), slots, t)
        out.append(float(p))
    return out


@pytest.mark.parametrize(("optimizer", "wd", "expected"), [
    # lr 0.1, betas (0.9, 0.999), eps 1e-8. Step 1: m = 0.1 g, v = 0.001 g^2, so m / (1 - 0.9) = g and
    # sqrt(v / (1 - 0.999)) = |g|: p moves by lr = 0.1 (less eps). Step 2 (g = -1): m = 0.9 * 0.2 - 0.1 = 0.08,
    # v = 0.999 * 0.004 + 0.001 = 0.004996; p = 0.9 - 0.1 * (0.08 / 0.19) / sqrt(0.004996 / 0.001999)
    # = 0.9 - 0.1 * 0.4210526 / 1.5809015 = 0.8733663
    ("adam", 0.0, [0.9, 0.8733663]),
    # wd 0.1 as an L2 term: g1 = 2 + 0.1 * 1 = 2.1 (p1 = 0.9 as above), g2 = -1 + 0.1 * 0.9 = -0.91;
    # m = 0.189 - 0.091 = 0.098, v = 0.999 * 0.00441 + 0.001 * 0.8281 = 0.00523369;
    # p2 = 0.9 - 0.1 * (0.098 / 0.19) / sqrt(0.00523369 / 0.001999) = 0.9 - 0.1 * 0.5157895 / 1.6180734 = 0.8681232
    ("adam", 0.1, [0.9, 0.8681232]),
    # AdamW: p <- (1 - lr * wd) p first, then Adam's step from the plain gradient:
    # p1 = 0.99 - 0.1 = 0.89; p2 = 0.99 * 0.89 - 0.0266337 (step 2 of the first row) = 0.8544663
    ("adamw", 0.1, [0.89, 0.8544663]),
])
def test_adam_and_adamw_two_steps_by_hand(optimizer, wd, expected):
    assert _two_steps(replace(ADAM, optimizer=optimizer, weight_decay=wd)) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(("optimizer", "wd"), [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1)])
def test_the_step_is_torch_optims(optimizer, wd):
    hp = replace(ADAM, optimizer=optimizer, weight_decay=wd)
    torch_cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer]
    ours = torch.tensor([1.0, -0.5, 2.0])
    theirs = ours.clone().requires_grad_()
    opt = torch_cls([theirs], lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=wd, foreach=False)
    slots = local_optim.new_slots(hp, ours)
    for t, g in enumerate(torch.tensor([[2.0, 0.1, -3.0], [-1.0, 0.4, 0.5], [0.3, 0.3, 0.3]]), 1):
        theirs.grad = g.clone()
        opt.step()
        local_optim.step_(hp, ours, g.clone(), slots, t)
        assert torch.equal(ours, theirs.detach()), t  # the very same float operations


def _client_data():
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    return model, x, y


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("path", ["sequential", "vmap", "stacked"])
def test_each_path_trains_one_client_as_torch_optim(path, optimizer):
    """One client, 10 samples at batch 4 (a short last batch), two epochs: every path's parameters equal a
    plain loop of torch.optim.SGD (momentum 0.9) / Adam / AdamW (weight decay 0.01) over the same batches."""
    model, x, y = _client_data()
    hp = Hyper(lr=0.01, momentum=0.9 if optimizer == "sgd" else 0.0, weight_decay=0.01, local_epochs=2,
               batch_size=4, optimizer=optimizer)
    job = ClientJob(0, torch.arange(10), None, 5)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    ref = copy.deepcopy(model)
    kw = {"momentum": 0.9} if optimizer == "sgd" else {"betas": hp.betas, "eps": hp.eps}
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer](
        ref.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, **kw)
    for batch in client_schedule(job, hp):
        opt.zero_grad()
        masked_cross_entropy(ref(x[batch], torch.zeros_like(y[batch])), y[batch], None).mean().backward()
        opt.step()
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    if path == "sequential":
        out, _ = train_sequential(model, start, [job], x, y, 0, hp, round_methods)
    else:
        out, _ = train_batched(model, start, [job], x, y, 0, replace(hp, path=path), round_methods)
    for k, v in ref.named_parameters():
        assert torch.allclose(out[k][0], v.detach(), atol=1e-6, rtol=1e-5), k
        assert not torch.allclose(out[k][0], start[k], atol=1e-4), k  # it trained


@pytest.mark.parametrize(("optimizer", "momentum"), [("sgd", 0.9), ("adam", 0.0), ("adamw", 0.0)])
@pytest.mark.parametrize("path", ["vmap", "stacked"])
def test_ragged_clients_with_a_penalty_train_as_one_at_a_time(path, optimizer, momentum):
    """Clients of 13, 9 and 18 samples at batch 4 take 4, 3 and 5 steps a round (twice, two epochs): a client
    past its last step must keep its parameters and moments, and each client's bias correction counts its own
    steps. FedProx's penalty enters the optimiser's gradient (on the stacked path, from its fused terms)."""
    model, x, y = _client_data()
    parts = torch.arange(40).split([13, 9, 18])
    jobs = [ClientJob(c, parts[c], None, 100 + c) for c in range(3)]
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedProx(FedProxHyperparams(mu=0.5), None)], [MethodState()], [{}])
    hp = Hyper(lr=0.01, momentum=momentum, weight_decay=0.01, local_epochs=2, batch_size=4, optimizer=optimizer)
    assert choose_path(model, hp, round_methods.methods).path == "stacked"
    ref, _ = train_sequential(model, start, jobs, x, y, 0, hp, round_methods)
    out, _ = train_batched(model, start, jobs, x, y, 0, replace(hp, path=path), round_methods)
    for k in ref:
        assert torch.allclose(out[k], ref[k], atol=1e-6, rtol=1e-5), k


def test_adam_differs_from_sgd():
    """The control: the optimiser key changes the trained parameters."""
    model, x, y = _client_data()
    job = ClientJob(0, torch.arange(10), None, 5)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    sgd = replace(ADAM, optimizer="sgd", path="stacked")
    a, _ = train_batched(model, start, [job], x, y, 0, sgd, round_methods)
    b, _ = train_batched(model, start, [job], x, y, 0, replace(sgd, optimizer="adam"), round_methods)
    assert not torch.allclose(a["head.weight"], b["head.weight"])
