"""Resume across a task end: a method whose ``server_event`` writes a synthetic pool into its server
state (from the final global model and torch's generator), ships it as ``"task_start"`` and trains on it with
``samples``' step draw and ``loss``'s extra part ends bit for bit like an uninterrupted run, bytes included, whether
it stopped just after the task end or in the next task."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from cfl.methods import METHODS
from cfl.methods.base import Computes, Method, Samples, Sends
from cfl.plugin import Draw, LossTerms
from cfl.validation import from_dict
from tests.conftest import make_stream


class DataFree(Method):
    """A toy TARGET: a pool of random inputs pushed along the teacher's first layer, KD toward its logits."""

    name = "data-free-toy"
    sends = Sends(server_events=("before_task_end",), broadcast={"task_start": ("pool", "targets")})
    computes = Computes(losses=("extra",), draws=("step",))


    def server_event(self, ctx):
        model, classes, server, task = ctx.model, ctx.classes, ctx.server, ctx.task  # noqa: F841
        with torch.no_grad():
            pool = torch.randn(6, model.body[1].in_features) + model.body[1].weight[:1].detach()
            server["pool"], server["targets"] = pool, model(pool, torch.zeros(6, dtype=torch.long))
            server["teacher_norm"] = sum(p.norm() for p in model.parameters())

    def samples(self, ctx):
        generator, server = ctx.generator, ctx.server
        if "pool" not in server:
            return None
        rows = torch.randint(0, len(server["pool"]), (3,), generator=generator)
        return Draw(step=Samples(server["pool"][rows], rows, torch.zeros(3, dtype=torch.long)))

    def loss(self, ctx):
        params, x, server, samples = ctx.params, ctx.x, ctx.server, ctx.samples
        if samples is None:
            return LossTerms(extra=x.new_zeros(x.shape[0]))
        logits = functional_call(self.run_info.model, params, (samples.x, samples.task))
        kd = (logits - server["targets"][samples.y]).pow(2).mean(1)
        return LossTerms(extra=x.new_zeros(x.shape[0]) + (kd * samples.weight).sum() / samples.weight.sum())


@pytest.mark.parametrize("stop_at", [2, 3], ids=["after-task-end", "in-the-next-task"])
def test_resume_across_a_task_end_is_bit_identical(tmp_path, stop_at):
    """3 clients, 2 a round: a client of the resumed round was sampled before the stop too (counted once)."""
    with METHODS.temporarily("data-free-toy", DataFree):
        cfg = from_dict({"num_clients": 3, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8,
                         "lr": 0.1, "method": {"name": "data-free-toy"}, "wandb": {"mode": "disabled"}})
        stream = make_stream("task", num_tasks=3, n_train=32, n_test=6)
        reference = Runner(cfg, stream)
        reference.run()

        stopped = Runner(cfg, stream)
        stopped.should_stop = lambda: stopped.progress.global_round == stop_at
        stopped.run()
        checkpoint.save(tmp_path, checkpoint.capture(stopped.snapshot(), None))
        torch.manual_seed(123)  # whatever ran in between
        resumed = Runner(cfg, stream)
        resumed.resume(checkpoint.restore(resumed.snapshot(), checkpoint.load(tmp_path)))
        resumed.run()
    assert all(torch.equal(resumed.params[k], reference.params[k]) for k in reference.params)
    ours, theirs = resumed.states[0].server, reference.states[0].server
    assert sorted(ours) == sorted(theirs) == ["pool", "stats", "targets", "teacher_norm"]
    assert all(torch.equal(ours[k], theirs[k]) for k in ("pool", "targets", "teacher_norm"))
    assert resumed.comm.lines == reference.comm.lines and resumed.comm.lines["task_start.data-free-toy"] > 0
    assert resumed.comm.download_bytes == reference.comm.download_bytes
    assert resumed.progress.acc_matrix == reference.progress.acc_matrix
