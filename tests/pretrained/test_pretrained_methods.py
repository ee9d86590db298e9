"""fedncm and afcl by hand: the closed form equals the centralised ridge regression on the union of the clients'
data (float64, 1e-8), the class means are the classifier, and the statistics are sent once per task."""

from __future__ import annotations

import pytest
import torch

from cfl.methods.afcl import AFCL, AFCLHyperparams, ridge, with_bias
from cfl.methods.base import ClientData, Payload, RunInfo
from cfl.methods.fedncm import FedNCM, FedNCMHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.models.feature_head import FeatureHead

D, K = 6, 3


def run_info(multi: bool = False, tasks: int = 2) -> RunInfo:
    return RunInfo(tasks, "task" if multi else "class", 3, 3, 0, FeatureHead(D, K, tasks, multi))


def clients(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, D, generator=g, dtype=torch.float32), torch.randint(0, K, (n,), generator=g))
            for n in (5, 9, 14)]


def global_params(info: RunInfo) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in info.model.named_parameters()}


def rounds(method, data_per_task, info):
    """Every client's client_end over the tasks, server_event("round"): the final head."""
    server, states, params = {}, [{} for _ in data_per_task[0]], global_params(info)
    for task, data in enumerate(data_per_task):
        for _ in range(2):  # two rounds: the second sends nothing
            uploads = {}
            for c, (x, y) in enumerate(data):
                up = method.client_end(ClientEndContext("round", info.model, params, ClientData(x, y, task), states[c],
                                                        {}, None))
                if up is not None:
                    uploads[c] = up
            change = method.server_event(ServerEvent("round", server, task, params, uploads, info.model))
            params.update(change.params if change is not None else {})
    return params, server


def test_afcl_equals_the_centralised_ridge_solution_on_the_union():
    info = run_info()
    data = [clients(0), clients(1)]
    params, _ = rounds(AFCL(AFCLHyperparams(gamma=0.5), info), data, info)
    x = torch.cat([x for task in data for x, _ in task]).to(torch.float64)
    y = torch.cat([y for task in data for _, y in task])
    xb = with_bias(x)
    onehot = torch.nn.functional.one_hot(y, K).to(torch.float64)
    central = torch.linalg.solve(xb.T @ xb + 0.5 * torch.eye(D + 1, dtype=torch.float64), xb.T @ onehot)
    method = AFCL(AFCLHyperparams(gamma=0.5), info)
    _, server = rounds(method, data, info)
    solved = ridge(server["gram"][0], server["cross"][0], 0.5)
    assert torch.allclose(solved, central, atol=1e-8, rtol=0)  # float64, before the head's float32
    assert torch.allclose(params["head.weight"].double(), central[:-1].T, atol=1e-6)
    assert torch.allclose(params["head.bias"].double(), central[-1], atol=1e-6)


def test_statistics_are_sent_once_per_task_and_counted_as_sent():
    info = run_info()
    method = AFCL(AFCLHyperparams(), info)
    x, y = clients()[0]
    state: dict = {}
    first = method.client_end(ClientEndContext("round", info.model, {}, ClientData(x, y, 0), state, {}, None))
    assert method.client_end(ClientEndContext("round", info.model, {}, ClientData(x, y, 0), state, {}, None)) is None
    assert method.client_end(ClientEndContext("round", info.model, {}, ClientData(x, y, 1), state, {},
                                              None)) is not None
    assert method.count_bytes(Payload("round_upload", payload=first)) == ((D + 1) * (D + 1) + (D + 1) * K) * 8
    assert method.count_bytes(Payload("client_upload")) == 0  # no parameter is sent


def test_fedncm_classifier_is_the_class_means():
    info = run_info(multi=True)
    data = [clients(2), clients(3)]
    params, _ = rounds(FedNCM(FedNCMHyperparams(metric="euclidean"), info), data, info)
    for task in range(2):
        x = torch.cat([x for x, _ in data[task]])
        y = torch.cat([y for _, y in data[task]])
        means = torch.stack([x[y == c].mean(0) for c in range(K)])
        assert torch.allclose(params["head.weight"][task], means, atol=1e-6)
        assert torch.allclose(params["head.bias"][task], -0.5 * (means * means).sum(1), atol=1e-5)
    cosine, _ = rounds(FedNCM(FedNCMHyperparams(), info), data, info)
    assert torch.allclose(cosine["head.weight"][0].norm(dim=1), torch.ones(K))
    assert torch.equal(cosine["head.bias"], torch.zeros(2, K))


def _l2p(lam: float = 0.1):
    pytest.importorskip("timm")
    import timm

    from cfl.methods.l2p import L2P, L2PHyperparams
    from cfl.pretrained.adapted import AdaptedViT

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=16)
    model = AdaptedViT(vit, "prompts", 4, 2, False, 16, "bicubic", prompt=(4, 2, 2))
    info = RunInfo(num_tasks=2, scenario="class", num_clients=1, clients_per_round=1, seed=0, model=model)
    return L2P(L2PHyperparams(lam=lam), info), model


def test_the_l2p_head_reads_the_mean_of_the_prompt_tokens_outputs():
    _, model = _l2p()
    outputs = []
    handle = model.vit.norm.register_forward_hook(lambda _m, _i, out: outputs.append(out))
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        features = model.features(x)
    handle.remove()
    tokens = outputs[-1]  # the prompted forward's final norm: [CLS], 2 x 2 selected prompt tokens, patches
    assert torch.allclose(features, tokens[:, 1:5].mean(1)) and not torch.allclose(features, tokens[:, 0])


def test_the_l2p_surrogate_loss_scales_with_lam():
    from cfl.pretrained.prompt_pool import key_distance

    low, model = _l2p(0.1)
    high, _ = _l2p(2.5)
    params, x, task = dict(model.named_parameters()), torch.randn(3, 3, 8, 8), torch.zeros(3, dtype=torch.long)
    distance = key_distance(model.query(x), params["prompt.keys"], 2)
    assert distance.abs().min() > 0.1
    assert torch.allclose(low.loss(LossContext("extra", params, x, task, torch.ones(len(x)), {}, {})).extra,
                          0.1 * distance)
    assert torch.allclose(high.loss(LossContext("extra", params, x, task, torch.ones(len(x)), {}, {})).extra,
                          2.5 * distance)
