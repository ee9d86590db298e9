
"""The vmap-free stacked path: a fused SGD step in each linear layer's backward, same results."""

from dataclasses import replace

import pytest
import torch

from cfl.engine.local import batched as local_batched
from cfl.engine.local import stacked as local_stacked
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.path import choose_path
from cfl.engine.local.stacked_kernels import FusedLinearSGD, ReluDropout
from cfl.engine.local.stacked_net import StackedNet
from cfl.methods.er import ER, ERHyperparams
from cfl.methods.ewc import EWC, EWCHyperparams
from cfl.methods.fedavg import FedAvg
from cfl.methods.fedcurv import FedCurv, FedCurvHyperparams
from cfl.methods.fedprox import FedProx, FedProxHyperparams
from cfl.models.alexnet import AlexNetLike
from cfl.models.dropout import Dropout
from cfl.models.mlp import MLP
from cfl.plugin import Computes, LossTerms
from cfl.records.client_states import MethodState


def test_fused_linear_steps_weights_in_backward_by_hand():
    x = torch.tensor([[[1.0, 2.0]]])  # one client, one sample, 2 inputs
    w = torch.tensor([[[1.0, 3.0]]])  # (C, out, in) as nn.Linear stores it: W = [[1, 3]]
    b = torch.tensor([[0.5]])
    token = torch.zeros((), requires_grad=True)
    out = FusedLinearSGD.apply(x, w, b, token, 0.1, 0.9)  # lr 0.1, decay 1 - lr*wd = 0.9
    assert out.item() == pytest.approx(1 + 6 + 0.5)
    torch.autograd.grad((out * 2.0).sum(), [token], allow_unused=True)  # dL/dout = 2
    # W <- 0.9 W - 0.1 * 2 * x = [0.9 - 0.2, 2.7 - 0.4]; b <- 0.9 * 0.5 - 0.1 * 2
    assert torch.allclose(w, torch.tensor([[[0.7, 2.3]]]))
    assert torch.allclose(b, torch.tensor([[0.25]]))


def test_input_gradient_uses_the_weights_before_the_step():
    x = torch.tensor([[[1.0, 2.0]]], requires_grad=True)
    w = torch.tensor([[[1.0, 3.0]]])
    token = torch.zeros((), requires_grad=True)
    out = FusedLinearSGD.apply(x, w, None, token, 0.1, 1.0)
    (grad_x,) = torch.autograd.grad(out.sum(), [x])
    assert torch.allclose(grad_x, torch.tensor([[[1.0, 3.0]]]))  # W before the step, not after


def _train(model, round_methods, hp, jobs, x, y, stacked: bool):
    hp = replace(hp, path="stacked" if stacked else "vmap")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return train_batched(model, params, jobs, x, y, 1, hp, round_methods)


@pytest.mark.parametrize("multi_head", [False, True])
@pytest.mark.parametrize("replay", [False, True])
def test_stacked_path_matches_vmap_path(multi_head, replay):
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3, num_tasks=2, multi_head=multi_head)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    sizes = [13, 9, 18]  # ragged: clients sorted by steps, shorter ones stop early
    parts = torch.arange(40).split(sizes)
    jobs = [ClientJob(c, parts[c], None, 100 + c) for c in range(3)]
    hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4)
    method = ER(ERHyperparams(mem_per_client=5, replay_batch_size=3), None) if replay else FedAvg(None, None)
    states = [MethodState()]
    if replay:  # memories of task 0 (the round trains task 1: a batch mixes both heads)
        for c in range(3):
            states[0].clients.put(c, dict(x=torch.randn(5, 6), y=torch.randint(0, 3, (5,)),
                                          task=torch.zeros(5, dtype=torch.long), valid=torch.arange(5) < 4))
    round_methods = RoundMethods([method], states, [{}])
    fast, fast_out = _train(model, round_methods, hp, jobs, x, y, True)
    ref, ref_out = _train(model, round_methods, hp, jobs, x, y, False)
    for k in ref:
        assert torch.allclose(fast[k], ref[k], atol=1e-6, rtol=1e-5), k
    assert [o.mean_loss for o in fast_out] == pytest.approx([o.mean_loss for o in ref_out], rel=1e-5)


def test_stacked_path_only_on_listed_layers_and_fused_hooks():
    model = MLP(6, [5], 3)
    plain = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4)
    assert choose_path(model, plain, [FedAvg(None, None)]).path == "stacked"
    assert choose_path(model, plain, [FedProx(FedProxHyperparams(), None)]).path == "stacked"  # a fused penalty
    momentum = choose_path(model, Hyper(0.1, 0.9, 0.0, 1, 4), [FedAvg(None, None)])  # momentum, Adam
    assert momentum.path == "stacked" and "SGD with momentum 0.9" in momentum.reason
    adam = choose_path(model, replace(plain, optimizer="adam"), [FedProx(FedProxHyperparams(), None)])
    assert adam.path == "stacked" and "adam steps" in adam.reason

    class PerSample(FedAvg):
        name = "per-sample"
        computes = Computes(losses=("extra",))

        def loss(self, ctx):
            x = ctx.x
            return LossTerms(extra=x.sum(-1))

    extra = choose_path(model, plain, [PerSample(None, None)])
    assert extra.as_dict() == {"path": "vmap", "reason": "method per-sample declares losses 'extra', which needs "
                                                         "per-sample losses"}
    assert extra.line() == f"engine: vmap path (reason: {extra.reason})"
    unlisted = choose_path(torch.nn.Sequential(), plain, [FedAvg(None, None)])
    assert unlisted.path == "vmap" and "stack_layers" in unlisted.reason
    assert choose_path(model, plain, [FedAvg(None, None)], "sequential").path == "sequential"
    assert local_stacked.StackedNet is StackedNet


def test_stacked_alexnet_grouped_convolutions_match_vmap_path():
    torch.manual_seed(0)
    model = AlexNetLike(3, 32, 4, num_tasks=2, multi_head=True)
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = 0.0  # the two paths draw dropout masks in different orders
    x, y = torch.randn(14, 3, 32, 32), torch.randint(0, 4, (14,))
    parts = torch.arange(14).split([5, 9])
    jobs = [ClientJob(c, parts[c], None, 7 + c) for c in range(2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.01, local_epochs=1, batch_size=4)
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    fast, _ = _train(model, round_methods, hp, jobs, x, y, True)
    ref, _ = _train(model, round_methods, hp, jobs, x, y, False)
    for k in ref:
        assert torch.allclose(fast[k], ref[k], atol=1e-5, rtol=1e-4), k


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_fused_relu_dropout_equals_the_two_layers(p):
    layer = Dropout(p).train()
    x = torch.randn(3, 5, 70)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(4)
    ref = layer(torch.relu(x1))
    torch.manual_seed(4)
    h = x2 * 1.0  # as in the net: the input is a layer's output, which the fused function overwrites
    fused = ReluDropout.apply(h, layer.keep_mask(h), 1.0 / layer.keep_prob)
    assert torch.equal(fused, ref)  # same draw, same values
    g = torch.randn_like(ref)
    ref.backward(g)
    fused.backward(g)
    assert torch.equal(x1.grad, x2.grad)


def test_a_kept_workspace_is_reused_and_changes_no_result():
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    jobs = [ClientJob(c, part, None, 7 + c) for c, part in enumerate(torch.arange(40).split(10))]
    hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=1, batch_size=4)
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    fresh, _ = train_batched(model, params, jobs, x, y, 0, hp, round_methods)
    trainer = local_batched.BatchedTrainer()
    first = {k: v.clone() for k, v in trainer(model, params, jobs, x, y, 0, hp, round_methods)[0].items()}
    pointers = {k: v.data_ptr() for k, v in trainer.workspace.items()}
    second, _ = trainer(model, params, jobs, x, y, 0, hp, round_methods)
    assert {k: v.data_ptr() for k, v in second.items()} == {k: pointers[k] for k in second}  # overwritten
    assert {k: v.data_ptr() for k, v in trainer.workspace.items()} == pointers  # the step's scratch buffers too
    assert any(k.startswith("scratch:") for k in pointers)
    for k in fresh:
        assert torch.equal(fresh[k], first[k]) and torch.equal(first[k], second[k]), k


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])  # the stacked path and the vmap path
def test_client_blocks_give_the_results_of_one_block(method):
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    jobs = [ClientJob(c, part, None, 7 + c) for c, part in enumerate(torch.arange(40).split([13, 9, 18]))]
    local = FedAvg(None, None) if method == "fedavg" else FedProx(FedProxHyperparams(mu=0.5), None)
    round_methods = RoundMethods([local], [MethodState()], [{}])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    results = {}
    for block in (0, 1, 2):  # 0: auto, all three together for an MLP
        hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4, client_block=block)
        trained, outcomes = train_batched(model, params, jobs, x, y, 0, hp, round_methods)
        results[block] = ({k: v.clone() for k, v in trained.items()}, [o.cid for o in outcomes])
    for block in (1, 2):
        assert results[block][1] == [0, 1, 2]  # outcomes in job order
        for k in params:
            assert torch.allclose(results[block][0][k], results[0][0][k], atol=1e-6, rtol=1e-5), (block, k)


def test_auto_client_block_is_one_for_conv_nets_on_cpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert local_batched.auto_client_block(AlexNetLike(3, 32, 4, 2, True), cpu, 25) == 1
    assert local_batched.auto_client_block(AlexNetLike(3, 32, 4, 2, True), cuda, 25) == 25
    assert local_batched.auto_client_block(MLP(6, [5], 3), cpu, 64) == 64


def test_the_engine_says_when_its_own_choice_trains_clients_one_at_a_time():
    cpu, cuda, conv = torch.device("cpu"), torch.device("cuda"), AlexNetLike(3, 32, 4, 2, True)
    line = local_batched.client_block_line(conv, cpu, 25, 0)
    assert line is not None and "25 clients" in line and "one at a time" in line and "client_block: N" in line
    assert local_batched.client_block_line(conv, cpu, 25, 5) is None  # the config chose
    assert local_batched.client_block_line(conv, cuda, 25, 0) is None  # all together
    assert local_batched.client_block_line(conv, cpu, 1, 0) is None  # nothing to batch
    assert local_batched.client_block_line(MLP(6, [5], 3), cpu, 64, 0) is None


def test_fused_relu_dropout_epilogue_and_folded_scale_match_autograd():
    torch.manual_seed(0)
    dropout = Dropout(0.5).train()
    x, g = torch.randn(2, 6, 5), torch.randn(2, 6, 3)  # 2 clients, 6 samples
    w1, b1, w2, b2 = torch.randn(2, 4, 5), torch.randn(2, 4), torch.randn(2, 3, 4), torch.randn(2, 3)
    lr, decay = 0.1, 0.99
    ref = [t.clone().requires_grad_() for t in (w1, b1, w2, b2)]
    torch.manual_seed(4)
    h = torch.relu(x @ ref[0].mT + ref[1].unsqueeze(1))
    u = h * dropout.keep_mask(h.detach()) * 2.0  # inverted dropout, keep probability 1/2
    out_ref = u @ ref[2].mT + ref[3].unsqueeze(1)
    grads = torch.autograd.grad((out_ref * g).sum(), ref)
    token = torch.zeros((), requires_grad=True)
    torch.manual_seed(4)
    hidden = FusedLinearSGD.apply(x, w1, b1, token, lr, decay, 1.0, True, dropout)  # handed over unscaled
    out = FusedLinearSGD.apply(hidden, w2, b2, token, lr, decay, 1 / dropout.keep_prob)
    assert torch.allclose(out, out_ref, atol=1e-5)
    torch.autograd.grad((out * g).sum(), [token], allow_unused=True)
    for stepped, before, grad in zip((w1, b1, w2, b2), ref, grads, strict=True):
        assert torch.allclose(stepped, decay * before.detach() - lr * grad, atol=1e-5)


def _penalty_round_methods(name: str, params: dict, clients: int) -> RoundMethods:
    """The method with states (and broadcast) as they are after a finished task / a FedCurv round."""
    g = torch.Generator().manual_seed(3)
    rand = lambda v: torch.rand(v.shape, generator=g)  # noqa: E731
    state, broadcast, rand_params = MethodState(), {}, lambda shift=0.0: {k: rand(v) + shift for k, v in params.items()}
    if name == "fedprox":
        method = FedProx(FedProxHyperparams(mu=0.7), None)
    elif name == "ewc":
        method = EWC(EWCHyperparams(lam=3.0), None)
        for c in range(clients):
            anchor = {k: v + a for (k, v), a in zip(params.items(), rand_params(-0.5).values(), strict=True)}
            state.clients.put(c, {"fisher": rand_params(), "anchor": anchor})
    else:
        method = FedCurv(FedCurvHyperparams(lam=0.5), None)
        broadcast = {"u": {k: 3 * rand(v) for k, v in params.items()}, "v": {k: rand(v) for k, v in params.items()},
                     "round": torch.tensor(4, dtype=torch.int32)}
        for c in range(clients - 1):  # the last client has no contribution yet; client 0's is inside u, v
            state.clients.put(c, {"I": rand_params(), "Iw": rand_params(),
                                  "round": torch.tensor(3 if c == 0 else 1, dtype=torch.int32)})
    return RoundMethods([method], [state], [broadcast])


@pytest.mark.parametrize("name", ["fedprox", "ewc", "fedcurv"])
@pytest.mark.parametrize("multi_head", [False, True])  # multi: the head's parameters take the unfused step
def test_stacked_path_takes_quadratic_penalties_like_the_vmap_path(name, multi_head):
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3, num_tasks=2, multi_head=multi_head)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    parts = torch.arange(40).split([13, 9, 18])  # ragged
    jobs = [ClientJob(c, parts[c], None, 100 + c) for c in range(3)]
    hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = _penalty_round_methods(name, params, 3)
    fast, _ = _train(model, round_methods, hp, jobs, x, y, True)
    ref, _ = _train(model, round_methods, hp, jobs, x, y, False)
    plain, _ = _train(model, RoundMethods([FedAvg(None, None)], [MethodState()], [{}]), hp, jobs, x, y, True)
    for k in ref:
        assert torch.allclose(fast[k], ref[k], atol=1e-5, rtol=1e-4), k
    assert any(not torch.allclose(plain[k], ref[k], atol=1e-3) for k in ref)  # the penalty mattered


def test_stacked_alexnet_takes_fedprox_on_its_convolutions_like_the_vmap_path():
    torch.manual_seed(0)
    model = AlexNetLike(3, 32, 4, num_tasks=2, multi_head=True)
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = 0.0
    x, y = torch.randn(10, 3, 32, 32), torch.randint(0, 4, (10,))
    jobs = [ClientJob(c, part, None, 7 + c) for c, part in enumerate(torch.arange(10).split([4, 6]))]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.01, local_epochs=1, batch_size=4)
    round_methods = RoundMethods([FedProx(FedProxHyperparams(mu=5.0), None)], [MethodState()], [{}])
    fast, _ = _train(model, round_methods, hp, jobs, x, y, True)
    ref, _ = _train(model, round_methods, hp, jobs, x, y, False)
    for k in ref:
        assert torch.allclose(fast[k], ref[k], atol=1e-5, rtol=1e-4), k


def update_error(a: dict, b: dict, start: dict) -> float:
    """The largest, over parameters, norm of ``a - b`` relative to the norm of ``b``'s update from ``start``."""
    return max(float((a[k] - b[k]).norm() / (b[k] - start[k]).norm()) for k in b)


@pytest.mark.parametrize("model_name", ["mlp", "mlp-multi-head", "alexnet"])
def test_bf16_mixed_stacked_path_matches_vmap_path_within_bfloat16_rounding(model_name):
    """Both paths multiply in bfloat16 (the stacked one by hand, vmap under autocast) over float32 weights:
    they agree to bfloat16 rounding, the weights stay float32, and the products really are bfloat16 ones (the
    result is not float32's). Measured, relative to the update's norm: the MLPs under 0.04; AlexNet 0.14, as
    far as either path is from its float32 result (0.11-0.15: its small conv updates are sums of larger terms
    that cancel, so the products' rounding shows more)."""
    torch.manual_seed(0)
    if model_name == "alexnet":
        model, shape = AlexNetLike(3, 32, 4, num_tasks=2, multi_head=True), (3, 32, 32)
        for m in model.modules():
            if isinstance(m, Dropout):
                m.p = 0.0  # the two paths draw dropout masks in different orders
    else:
        model, shape = MLP(6, [5, 4], 3, num_tasks=2, multi_head=model_name.endswith("head")), (6,)
    x, y = torch.randn(40, *shape), torch.randint(0, 3, (40,))
    parts = torch.arange(40).split([13, 9, 18])
    jobs = [ClientJob(c, parts[c], None, 100 + c) for c in range(3)]
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.01, local_epochs=2, batch_size=4, precision="bf16-mixed")
    fast, fast_out = _train(model, round_methods, hp, jobs, x, y, True)
    ref, ref_out = _train(model, round_methods, hp, jobs, x, y, False)
    full, _ = _train(model, round_methods, Hyper(0.05, 0.0, 0.01, 2, 4), jobs, x, y, True)
    assert all(v.dtype == torch.float32 for v in fast.values())
    assert update_error(fast, ref, start) < 0.25
    assert [o.mean_loss for o in fast_out] == pytest.approx([o.mean_loss for o in ref_out], rel=0.02)
    assert update_error(fast, full, start) > 1e-4  # float32 products would agree to ~1e-6


def test_one_dropout_draw_for_all_layers_gives_the_per_layer_masks(monkeypatch):
    """StackedNet._draw_masks draws every layer's noise at once; on the CPU the words, hence the masks and
    the trained clients, equal one draw per layer (the generator's stream is consumed word by word)."""
    model = MLP(6, [5, 4], 3, dropouts=[0.2, 0.5])  # 16- and 8-bit noise
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    jobs = [ClientJob(c, part, None, 7 + c) for c, part in enumerate(torch.arange(40).split(10))]
    hp = Hyper(lr=0.2, momentum=0.0, weight_decay=0.01, local_epochs=1, batch_size=4, path="stacked")
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    drawn, original = [], StackedNet._draw_masks

    def recorded(net: StackedNet, *args: object) -> None:
        original(net, *args)
        drawn.append(sorted(net.scratch.drawn))

    monkeypatch.setattr(StackedNet, "_draw_masks", recorded)
    torch.manual_seed(5)
    at_once, _ = local_batched.BatchedTrainer()(model, params, jobs, x, y, 0, hp, round_methods)
    assert drawn and all(names == ["body.1", "body.4"] for names in drawn), drawn[:1]
    monkeypatch.setattr(StackedNet, "_draw_masks", lambda *_: None)  # each layer draws its own
    torch.manual_seed(5)
    per_layer, _ = local_batched.BatchedTrainer()(model, params, jobs, x, y, 0, hp, round_methods)
    for k in at_once:
        assert torch.equal(at_once[k], per_layer[k]), k
