"""FedWeIT's networks: a forward over the decomposed parameters (as the engine runs it, ``functional_call`` on a
parameter dict) equals a plain network run on the composed weights of each sample's task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from cfl.models.fedweit_net import FROZEN, SHARED, ChannelLRN, Decomposed, DecomposedConv2d, FedWeITLeNet, FedWeITMLP
from cfl.models.fedweit_weight import decomposed_weight, gate, hard_threshold

TASKS = torch.tensor([0, 1, 1, 0])


def randomised(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter drawn afresh (knowledge base and folded sums included), a few A entries near 0."""
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3 for n, p in model.named_parameters()}
    for name in params:
        if name.endswith(".adaptive"):
            params[name].view(-1)[::3] = 5e-4  # pruned at evaluation (|A| <= 1e-3)
    return params


def composed(params: dict[str, torch.Tensor], prefix: str, task: int, pruned: bool) -> torch.Tensor:
    mask, adaptive = gate(params[f"{prefix}.mask"][task]), params[f"{prefix}.adaptive"][task]
    if pruned:
        adaptive = hard_threshold(adaptive, 1e-3)
    return (decomposed_weight(params[f"{prefix}.base"], mask, adaptive, params[f"{prefix}.kb"],
                              params[f"{prefix}.attention"][task]) + params[f"{prefix}.kb_mix"][task])


def plain_forward(model: torch.nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, task: int,
                  pruned: bool) -> torch.Tensor:
    """The network with each decomposed layer replaced by a plain linear/conv on its composed weight."""
    h = x
    for i, layer in enumerate(model.body):
        prefix = f"body.{i}"
        if isinstance(layer, DecomposedConv2d):
            h = F.conv2d(h, composed(params, prefix, task, pruned), params[f"{prefix}.bias"][task], padding=2)
        elif isinstance(layer, Decomposed):
            h = F.linear(h, composed(params, prefix, task, pruned), params[f"{prefix}.bias"][task])
        else:
            h = layer(h)
    return h @ params["head.weight"][task].T + params["head.bias"][task]


#: batches of both tasks, and of one task only (a layer then composes that task's weight alone; task 1 sits at
#: index 0 among the tasks present)
PATTERNS = (TASKS, torch.tensor([1, 1, 1, 1]), torch.tensor([0, 0, 0, 0]))


def check_equal(model: torch.nn.Module, x: torch.Tensor, seed: int) -> None:
    model.double()
    params = randomised(model, seed)
    for train in (True, False):
        model.train(train)
        for tasks in PATTERNS:
            out = functional_call(model, params, (x, tasks))
            for t in tasks.unique().tolist():
                expected = plain_forward(model, params, x[tasks == t], t, pruned=not train)
                assert torch.allclose(out[tasks == t], expected, atol=1e-10), (train, tasks, t)


def test_mlp_forward_equals_the_composed_weights():
    check_equal(FedWeITMLP(6, [5, 4], classes=3, num_tasks=2, kb_size=2), torch.randn(4, 6, dtype=torch.float64), 0)


def test_lenet_forward_equals_the_composed_weights():
    x = torch.randn(4, 3, 4, 4, dtype=torch.float64)
    check_equal(FedWeITLeNet(3, 4, classes=2, num_tasks=2, kb_size=1), x, 1)


def test_evaluation_prunes_small_adaptive_entries():
    """The same parameters give different outputs in train and eval mode only through the pruned A entries."""
    model = FedWeITMLP(6, [5], classes=2, num_tasks=2, kb_size=1).double()
    params = randomised(model, 2)
    x = torch.randn(4, 6, dtype=torch.float64)
    evaluated = functional_call(model.eval(), params, (x, TASKS))
    assert not torch.allclose(evaluated, functional_call(model.train(), params, (x, TASKS)))
    params["body.1.adaptive"] = hard_threshold(params["body.1.adaptive"], 1e-3)
    assert torch.allclose(evaluated, functional_call(model.train(), params, (x, TASKS)))


def test_stacked_clients_under_vmap_match_each_client():
    model = FedWeITMLP(6, [5], classes=3, num_tasks=2, kb_size=2).double().train()
    one, two = randomised(model, 3), randomised(model, 4)
    stacked = {n: torch.stack([one[n], two[n]]) for n in one}
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    out = vmap(lambda p, xb: functional_call(model, p, (xb, TASKS)))(stacked, x)
    assert torch.allclose(out[0], functional_call(model, one, (x[0], TASKS)))
    assert torch.allclose(out[1], functional_call(model, two, (x[1], TASKS)))


def test_lenet_shapes_are_the_official_codes():
    """On 32x32x3 inputs the official shapes: conv (5,5,3,20), (5,5,20,50), fc (3200, 800), (800, 500)."""
    model = FedWeITLeNet(3, 32, classes=5, num_tasks=2, kb_size=3)
    bases = [layer.base.shape for layer in model.decomposed().values()]
    assert bases == [(20, 3, 5, 5), (50, 20, 5, 5), (800, 3200), (500, 800)]
    layer = model.decomposed()["body.0"]
    assert layer.adaptive.shape == (2, 20, 3, 5, 5) and layer.kb.shape == (3, 20, 3, 5, 5)
    assert layer.mask.shape == (2, 20) and layer.attention.shape == (2, 3)
    assert model(torch.randn(2, 3, 32, 32), torch.tensor([0, 1])).shape == (2, 5)


def test_local_response_norm_is_tensorflows():
    """TensorFlow's lrn(x, 4, bias=1, alpha=0.001/9, beta=0.75): x / (1 + alpha * sum of x^2 over 9 channels)^0.75."""
    x = torch.randn(1, 12, 1, 1, dtype=torch.float64) * 10
    lrn = FedWeITLeNet(3, 8, classes=2, num_tasks=1, kb_size=1).body[2]
    sq = x[0, :, 0, 0] ** 2
    expected = torch.stack([x[0, c, 0, 0] / (1 + 0.001 / 9 * sq[max(c - 4, 0) : c + 5].sum()) ** 0.75
                            for c in range(12)])
    assert torch.allclose(lrn(x)[0, :, 0, 0], expected)


@pytest.mark.parametrize("size", [1, 4, 5, 9])
@pytest.mark.parametrize("channels", [3, 12, 50])
def test_channel_lrn_equals_torchs_local_response_norm(size, channels):
    x = torch.randn(2, channels, 3, 4, dtype=torch.float64) * 3
    expected = torch.nn.LocalResponseNorm(size, alpha=0.001, beta=0.75, k=1.0)(x)
    assert torch.allclose(ChannelLRN(size, alpha=0.001, beta=0.75, k=1.0)(x), expected, rtol=0, atol=1e-12)


def test_initial_values():
    """A = base / 3 for every task, no knowledge base, task 0 without attention; the name sets are parameters."""
    model = FedWeITMLP(6, [5], classes=2, num_tasks=3, kb_size=2)
    layer = model.decomposed()["body.1"]
    assert torch.allclose(layer.adaptive, layer.base.expand(3, 5, 6) / 3)
    assert layer.kb.abs().sum() == 0 and layer.kb_mix.abs().sum() == 0 and layer.attention[0].abs().sum() == 0
    names = {n for n, _ in layer.named_parameters()}
    assert set(SHARED) | set(FROZEN) <= names


def test_a_shared_head_is_refused():
    with pytest.raises(ValueError, match="task-incremental"):
        FedWeITMLP(6, [5], classes=2, num_tasks=3, kb_size=2, multi_head=False)


def test_no_gradient_reaches_the_knowledge_base():
    """The knowledge base and the folded sums are the server's and past tasks': the loss never moves them."""
    model = FedWeITMLP(6, [5], classes=2, num_tasks=2, kb_size=2).double().train()
    params = {n: p.requires_grad_() for n, p in randomised(model, 5).items()}
    functional_call(model, params, (torch.randn(4, 6, dtype=torch.float64), TASKS)).sum().backward()
    assert params["body.1.kb"].grad is None and params["body.1.kb_mix"].grad is None
    assert params["body.1.attention"].grad.abs().sum() > 0 and params["body.1.base"].grad.abs().sum() > 0
