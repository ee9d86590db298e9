"""The engine's parameters kept per client, on plain plugins (FedWeIT's use: tests/methods/test_fedweit_engine.py).

The run: blobs of 12 inputs, 2 tasks of 3 classes (task-incremental), digits-mlp (12-128-128, heads 128 -> 3 per
task: ``head.weight`` (6, 128), ``head.bias`` (6,)), 3 clients, all sampled, 2 rounds of task 0."""

from __future__ import annotations

import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method, ParamNames, ParamRoles, Payload, StackedUploads, TrainedClient
from tests.conftest import make_stream, tiny_config
from tests.helpers import Records

HEAD = 6 * 128 * 4 + 6 * 4  # bytes of the heads


def _run(cls: type[Method], rounds: int = 2) -> tuple[Runner, Records, dict]:
    records = Records()
    with METHODS.temporarily(cls.name, cls):
        cfg = tiny_config(method={"name": cls.name}, num_clients=3, clients_per_round=3, rounds_per_task=rounds)
        runner = Runner(cfg, make_stream("task", num_tasks=2, dim=12), [records])
        template = {k: v.clone() for k, v in runner.params.items()}
        for r in range(rounds):
            records.rounds.append(runner.run_round(0, r))
    return runner, records, template


class OwnHeads(Method):
    """FedPer-like: the heads stay with each client."""

    name = "own-heads"

    def param_roles(self, ctx: ParamNames) -> ParamRoles:
        return ParamRoles(local=[n for n in ctx.names if n.startswith("head.")])


def test_local_parameters_stay_with_their_clients_and_out_of_the_bytes():
    runner, records, template = _run(OwnHeads)
    assert runner.engine_path.path == "sequential" and "(param_roles)" in runner.engine_path.reason
    full = sum(v.numel() * v.element_size() for v in template.values())
    assert runner.model_bytes == full - HEAD
    assert records.rounds[0]["round_download_bytes"] == 3 * (full - HEAD)
    assert records.rounds[0]["round_upload_bytes"] == 3 * (full - HEAD)
    assert torch.equal(runner.params["head.weight"], template["head.weight"])  # never aggregated
    assert not torch.equal(runner.params["body.1.weight"], template["body.1.weight"])
    heads = [runner.states[0].clients.get(c)["local"]["head.weight"] for c in range(3)]
    assert not torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], template["head.weight"])


def test_a_client_starts_its_next_round_from_its_own_local_parameters():
    runner, _, template = _run(OwnHeads, rounds=1)
    jobs = runner.schedule.round_jobs(0, 1)
    starts = runner.client_params.starts(jobs, runner.params, runner.states, [{}], 0)
    for job in jobs:
        own = runner.states[0].clients.get(job.cid)["local"]
        assert torch.equal(starts[job.cid]["head.weight"], own["head.weight"])
        assert not torch.equal(own["head.weight"], template["head.weight"])
        assert starts[job.cid]["body.1.weight"] is runner.params["body.1.weight"]


class FrozenBias(Method):
    name = "frozen-bias"

    def param_roles(self, ctx: ParamNames) -> ParamRoles:
        return ParamRoles(frozen=["body.1.bias"])


def test_frozen_parameters_do_not_move():
    runner, _, template = _run(FrozenBias)
    assert torch.equal(runner.params["body.1.bias"], template["body.1.bias"])
    assert not torch.equal(runner.params["body.3.bias"], template["body.3.bias"])


class OnesUpload(Method):
    """Sends a weight of ones (and a count), aggregated as the sum of the counts; 7 bytes per upload."""

    name = "ones-upload"

    def client_upload(self, ctx: TrainedClient) -> tuple[dict, dict]:
        return {"body.1.weight": torch.ones_like(ctx.params["body.1.weight"])}, {"count": torch.tensor(2.0)}

    def server_aggregate(self, ctx: StackedUploads) -> dict:
        return {"body.1.weight": ctx.sent["body.1.weight"].mean(0) * ctx.info["count"].sum()}

    def count_bytes(self, ctx: Payload) -> int | None:
        return 7 if ctx.kind == "client_upload" else None


def test_own_upload_and_aggregation_replace_the_mean_and_its_bytes():
    runner, records, template = _run(OnesUpload, rounds=1)
    assert torch.equal(runner.params["body.1.weight"], torch.full_like(template["body.1.weight"], 6.0))  # 3 x 2
    full = sum(v.numel() * v.element_size() for v in template.values())
    dense = template["body.1.weight"].numel() * 4
    assert records.rounds[0]["round_upload_bytes"] == 3 * (full - dense + 7)
    assert records.rounds[0]["round_download_bytes"] == 3 * full
