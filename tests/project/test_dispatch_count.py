"""benchmarks/dispatch_count.py: kernels, views and host reads counted by hand on small tensors, and the
engine's round counted (the figure perf_engine.py prints for the launch-bound GPU round)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cfl.engine.local.precision import has_bf16_units
from tests.helpers import benchmark_module

ROOT = Path(__file__).resolve().parents[2]


def _counter_module():
    return benchmark_module("dispatch_count")


def test_elementwise_ops_views_and_host_reads_are_counted_by_hand() -> None:
    counter_type = _counter_module().DispatchCounter
    a, b = torch.ones(3), torch.arange(3.0)
    with counter_type() as counter:
        c = a + b  # 1 kernel
        c.mul_(2)  # 1 kernel
        d = c.view(3, 1).t()  # 2 views, no kernel
        total = d.sum().item()  # sum: 1 kernel; item: _local_scalar_dense, 1 kernel and 1 host read
        listed = c.tolist()  # a host read without an operator
        kept = torch.nonzero(c)  # data-dependent output size: 1 kernel, 1 host read
    assert (counter.kernels, counter.views, counter.host_reads) == (5, 2, 3)
    assert counter.syncs == 0  # every tensor is on the CPU
    assert dict(counter.read_ops) == {"_local_scalar_dense": 1, "tolist": 1, "nonzero": 1}
    assert total == 12.0 and listed == [2.0, 4.0, 6.0] and kept.shape == (3, 1)


def test_patched_host_reads_are_restored_after_the_block() -> None:
    counter_type = _counter_module().DispatchCounter
    original = torch.Tensor.tolist
    with counter_type():
        assert torch.Tensor.tolist is not original
    assert torch.Tensor.tolist is original


def test_backward_kernels_are_counted() -> None:
    counter_type = _counter_module().DispatchCounter
    w = torch.ones(2, requires_grad=True)
    with counter_type() as forward_only:
        (w * 3).sum()
    with counter_type() as with_backward:
        (w * 3).sum().backward()
    assert with_backward.kernels > forward_only.kernels
    assert torch.equal(w.grad, torch.full((2,), 3.0))


NO_BF16_UNITS = "this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16): bf16-mixed is not the fast path here"
needs_bf16_units = pytest.mark.skipif(has_bf16_units(torch.device("cpu")) is not True, reason=NO_BF16_UNITS)


def _stacked_round(precision: int | str = 32):
    """One stacked engine round of 4 clients x 4 steps of the PMNIST MLP, counted after a warm-up round."""
    from cfl.engine.local.batched import BatchedTrainer
    from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods, derive_seed
    from cfl.methods.fedavg import FedAvg
    from cfl.models import ModelShape, build_model
    from cfl.records.client_states import MethodState

    counter_type = _counter_module().DispatchCounter
    torch.manual_seed(0)
    model = build_model("mlp", ModelShape((784,), 10, 1, False))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(4 * 64, 784), torch.randint(0, 10, (4 * 64,))
    parts = list(torch.arange(4 * 64).split(64))
    hp = Hyper(lr=0.01, momentum=0.0, weight_decay=1e-5, local_epochs=1, batch_size=16, path="stacked",
               precision=precision)
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    trainer = BatchedTrainer()
    jobs = [ClientJob(c, parts[c], None, derive_seed(0, 0, 0, c)) for c in range(4)]
    trainer(model, params, jobs, x, y, 0, hp, round_methods)  # warm-up: workspaces allocated
    with counter_type() as counter:
        trainer(model, params, jobs, x, y, 0, hp, round_methods)
    return counter, 64 // 16


def test_a_stacked_engine_round_dispatches_a_bounded_number_of_kernels_per_step() -> None:
    """The stacked path's kernels per batched local step on the PMNIST MLP (with dropout): the target was
    a third of the 118.1 a step of 2026-11-28; this round took 93.2 a step before the cut and 39.5 after it (its
    fixed per-round operators, the four clients' shuffles among them, spread over only 4 steps), so a change
    that adds per-step operators fails here, on the CPU, before any GPU minute is spent."""
    counter, steps = _stacked_round()
    per_step = counter.kernels / steps
    assert 20 < per_step <= 40, counter.summary(steps)


def test_a_stacked_engine_round_reads_the_host_twice() -> None:
    """No ``.item()`` per client: the round's losses and finiteness come back in one ``tolist`` each (was one
    ``bool()`` per client, 66 host reads in a 64-client round)."""
    counter, steps = _stacked_round()
    assert counter.host_reads == 2 and dict(counter.read_ops) == {"tolist": 2}, counter.summary(steps)


@needs_bf16_units
def test_a_bf16_mixed_round_is_counted_with_its_compiled_step_as_one_kernel() -> None:
    """Under the counter (a torch dispatch mode) the compiled bf16 step used to raise "torch.compile with
    fullgraph=True found no compiled frames"; it now runs outside the mode and counts one kernel a call."""
    from cfl.engine.local import bf16_step
    counter, steps = _stacked_round("bf16-mixed")
    if bf16_step._kernels.get("cpu") is None:
        pytest.skip("the bf16 step could not be compiled here (a warning said why): nothing compiled to count")
    assert counter.by_op["compiled_step_cast"] > 0, counter.summary(steps)
    original = bf16_step._kernel
    with _counter_module().DispatchCounter():
        assert bf16_step._kernel is not original
    assert bf16_step._kernel is original


@needs_bf16_units
def test_perf_engine_runs_its_bf16_mixed_path() -> None:
    """``benchmarks/perf_engine.py --precision bf16-mixed`` to its JSON line, the counted round included."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_engine.py"), "--precision", "bf16-mixed",
                           "--rounds", "1", "--naive-rounds", "0", "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["precision"] == "bf16-mixed" and out["kernels_per_round"] > 0
