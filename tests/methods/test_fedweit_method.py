"""FedWeIT's hooks called one by one, as the engine calls them (``cfl/engine/rounds/client_params.py``).

The net: FedWeIT's MLP, 4 inputs, one hidden layer ``body.1`` of 3 units, 2 classes, 2 tasks, 2 knowledge-base
slots; 3 clients, 2 per round."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call

from cfl.config.schema import ConfigError
from cfl.methods.base import ClientData, ClientRoundStart, ParamNames, Payload, RunInfo, StackedUploads, TrainedClient
from cfl.methods.fedweit import FedWeIT, FedWeITHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.models.fedweit_net import FedWeITMLP
from cfl.models.mlp import MLP
from cfl.ops.fedweit_losses import RegulariserWeights, regulariser

TASK0 = torch.zeros(5, dtype=torch.long)


def setup(seed: int = 0) -> tuple[FedWeIT, torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    net = FedWeITMLP(4, [3], classes=2, num_tasks=2, kb_size=2)
    info = RunInfo(num_tasks=2, scenario="task", num_clients=3, clients_per_round=2, seed=0, model=net)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    return FedWeIT(FedWeITHyperparams(), info), net, params


def test_only_the_bases_are_shared_and_the_knowledge_base_is_frozen():
    method, _, params = setup()
    roles = method.param_roles(ParamNames(tuple(params)))
    assert roles.local == [n for n in params if n != "body.1.base"]
    assert roles.frozen == ["body.1.kb", "body.1.kb_mix"]
    assert method.task_end_clients == 2 and method.kb_size == 2


def test_first_round_loads_no_knowledge_and_no_anchors():
    method, _, params = setup()
    state: dict = {}
    start = method.client_start(ClientRoundStart("params", {}, state, params, 0)).params
    assert state["task"] == 0 and state["anchors"]["body.1"].shape == (0, 3, 4)
    assert torch.equal(start["body.1.base"], params["body.1.base"])
    assert start["body.1.kb"].abs().sum() == 0
    x = torch.randn(5, 4)
    expected = regulariser(start, ["body.1"], 0, state["anchors"], RegulariserWeights())
    assert torch.allclose(method.loss(LossContext("extra", start, x, TASK0, torch.ones(len(x)), {}, state)).extra,
                          expected.expand(5))


def test_upload_sends_the_units_above_the_mask_threshold():
    """3 units, sparsity 0.3: floor(0.9) = 0, so the unit with the smallest |mask logit| is dropped, 2 sent."""
    method, _, params = setup()
    state: dict = {"task": 0}
    params["body.1.mask"][0] = torch.tensor([0.5, -0.1, 2.0])
    sent, keeps = method.client_upload(TrainedClient(params, state))
    assert keeps["body.1.base"].tolist() == [True, False, True]
    assert sent["body.1.base"][1].abs().sum() == 0 and torch.equal(sent["body.1.base"][0], params["body.1.base"][0])
    assert torch.equal(state["base"]["body.1"], params["body.1.base"])
    upload = Payload("client_upload", sent=sent, info=keeps)
    assert method.count_bytes(upload) == 2 * 4 * 4 + 1  # 2 rows of 4 float32, a 3-bit bitmap


def test_server_averages_each_unit_over_its_senders():
    method, _, _ = setup()
    sent = {"body.1.base": torch.tensor([[[1.0], [2.0], [0.0]], [[3.0], [0.0], [0.0]]], dtype=torch.float64)}
    keeps = {"body.1.base": torch.tensor([[True, True, False], [True, False, False]])}
    assert torch.allclose(method.server_aggregate(StackedUploads(sent, keeps))["body.1.base"],
                          torch.tensor([[2.0], [2.0], [0.0]], dtype=torch.float64))


def test_task_end_builds_a_padded_knowledge_base_and_counts_it():
    method, _, params = setup()
    adaptive = torch.zeros(2, 3, 4)
    adaptive[0, 0, 0], adaptive[0, 1, 1] = 0.5, 5e-4  # the second is pruned (|A| <= 1e-3)
    state = {"task": 0, "local": {"body.1.adaptive": adaptive}}
    upload = method.client_end(ClientEndContext("task_end", None, params, ClientData(torch.zeros(0), torch.zeros(0),
                                                                                     0), state, {}, torch.Generator()))
    assert torch.count_nonzero(upload["adaptive"]["body.1"]) == 1
    assert method.count_bytes(Payload("task_end_upload", payload=upload)) == 2 + 4  # a 12-bit bitmap, one float32
    server: dict = {}
    method.server_event(ServerEvent("task_end", server, 0, params, {7: upload}))
    kb = server["kb"]["body.1"]
    assert kb.shape == (2, 3, 4) and kb[0, 0, 0] == 0.5 and kb[1].abs().sum() == 0
    assert method.count_bytes(Payload("task_start", payload=server)) == (2 + 4) + 2


def test_a_new_task_keeps_the_old_tasks_outputs_and_merges_the_base():
    """At task 1's start: task 0's outputs are unchanged (its knowledge sum folded), the new knowledge base is
    loaded, the anchors are task 0's composed weight from the client's own base, and the base is the global one
    where that is not 0."""
    method, net, params = setup()
    params["body.1.kb"] = torch.randn(2, 3, 4)
    params["body.1.attention"][0] = torch.tensor([0.5, -1.0])
    own = params["body.1.base"].clone()
    state = {"task": 0, "base": {"body.1": own}, "anchors": {"body.1": torch.zeros(0, 3, 4)}}
    x = torch.randn(5, 4)
    before = functional_call(net.train(), params, (x, TASK0))
    new_kb = torch.randn(2, 3, 4)
    global_params = dict(params)
    global_params["body.1.base"] = torch.zeros(3, 4)
    global_params["body.1.base"][1] = 9.0  # unit 1 came from the server; units 0 and 2 nobody sent
    start = method.client_start(ClientRoundStart("params", {"kb": {"body.1": new_kb}}, state, global_params, 1)).params
    assert torch.equal(start["body.1.kb"], new_kb) and state["task"] == 1
    assert start["body.1.attention"][0].abs().sum() == 0
    assert torch.equal(start["body.1.base"][1], torch.full((4,), 9.0))
    assert torch.equal(start["body.1.base"][0], own[0]) and torch.equal(start["body.1.base"][2], own[2])
    anchor = own * torch.sigmoid(params["body.1.mask"][0]).unsqueeze(1) + params["body.1.adaptive"][0]
    assert torch.allclose(state["anchors"]["body.1"][0], anchor)
    unmerged = {**start, "body.1.base": own}
    assert torch.allclose(functional_call(net, unmerged, (x, TASK0)), before, atol=1e-6)


def test_refusals():
    with pytest.raises(ConfigError, match="weight_decay: 0"):
        FedWeIT.check(FedWeITHyperparams(), SimpleNamespace(weight_decay=0.1, stream=SimpleNamespace(scenario="task")))
    info = RunInfo(num_tasks=2, scenario="task", num_clients=3, clients_per_round=2, seed=0,
                   model=MLP(4, [3], 2, 2, True))
    with pytest.raises(ConfigError, match="task-incremental"):  # Method.requires.scenarios, when the method is built
        FedWeIT(FedWeITHyperparams(), replace(info, scenario="class"))
    with pytest.raises(ConfigError, match="FedWeIT's networks"):
        FedWeIT(FedWeITHyperparams(), info)
