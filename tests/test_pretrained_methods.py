"""fedncm and afcl by hand: the closed form equals the centralised ridge regression on the union of the clients'
data (float64, 1e-8), the class means are the classifier, and the statistics are sent once per task."""

from __future__ import annotations

import torch

from cfl.methods.afcl import AFCL, AFCLHyperparams, ridge, with_bias
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.fedncm import FedNCM, FedNCMHyperparams
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
    """Every client's client_end over the tasks, the server reduction and after_server_step: the final head."""
    server, states, params = {}, [{} for _ in data_per_task[0]], global_params(info)
    for task, data in enumerate(data_per_task):
        for _ in range(2):  # two rounds: the second sends nothing
            uploads = {}
            for c, (x, y) in enumerate(data):
                up = method.client_end("round", info.model, params, ClientData(x, y, task), states[c], {}, None)
                if up is not None:
                    uploads[c] = up
            method.server_end("round", uploads, server, task)
            params.update(method.after_server_step(info.model, params, server, task) or {})
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
    first = method.client_end("round", info.model, {}, ClientData(x, y, 0), state, {}, None)
    assert method.client_end("round", info.model, {}, ClientData(x, y, 0), state, {}, None) is None
    assert method.client_end("round", info.model, {}, ClientData(x, y, 1), state, {}, None) is not None
    assert method.payload_bytes("round_upload", first) == ((D + 1) * (D + 1) + (D + 1) * K) * 8
    assert method.upload_bytes({}, {}) == 0  # no parameter is sent


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
