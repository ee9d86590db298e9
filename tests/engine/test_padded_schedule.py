"""The batched trainer's padded schedule (built in a fixed number of operators besides the clients' shuffles)
holds each client's batches of ``client_schedule`` (the sequential trainer's) in order, padded with weight 0."""

from __future__ import annotations

import pytest
import torch

from cfl.engine.local.batched_round import padded_schedule
from cfl.engine.local.jobs import ClientJob, Hyper, client_schedule


@pytest.mark.parametrize("epochs,steps_per_epoch", [(1, None), (2, None), (2, 1)])
def test_padded_schedule_holds_each_clients_batches_in_order(epochs: int, steps_per_epoch: int | None) -> None:
    ids = torch.arange(100, 130)
    jobs = [ClientJob(c, part, None, 11 + c) for c, part in enumerate((ids[:10], ids[10:13], ids[13:30]))]
    for job in jobs:
        job.steps_per_epoch = steps_per_epoch
    hp = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=epochs, batch_size=4)
    index, weight, sizes, steps = padded_schedule(jobs, hp, torch.device("cpu"))
    schedules = [client_schedule(job, hp) for job in jobs]
    assert steps == [len(s) for s in schedules]
    assert index.shape == weight.shape == (max(steps), 3, 4)  # step-major
    for c, schedule in enumerate(schedules):
        for s in range(index.shape[0]):
            real = len(schedule[s]) if s < len(schedule) else 0
            assert int(sizes[c, s]) == real
            assert torch.equal(index[s, c, :real], schedule[s]) if real else True
            assert torch.equal(index[s, c, real:], jobs[c].indices[:1].expand(4 - real))  # its own first sample
            assert weight[s, c].tolist() == [1.0] * real + [0.0] * (4 - real)
