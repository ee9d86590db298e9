"""The synchronous schedule gives, for each method that per-client task boundaries changed (and the methods of
the reference rows), the results of the code before them: a tiny run's last accuracy row, its communication and a
checksum of its final parameters, measured on commit d4b1c84 (before per-client task-start broadcasts, held
task-end uploads and task-end draws among a task's finishers), on one CPU thread: TARGET's and MFCL's
generators move with the thread count's summation order. float32 sums differ between CPUs in the last digits:
the parameter checksums of the larger models were measured at d4b1c84 on the AMD EPYC VM and, where another CPU
gives others, on that CPU at 355bc6e (whose results equal d4b1c84's on the EPYC), in ``CHECKSUM_ON``, per torch
version too."""

from __future__ import annotations

import pytest
import torch

from cfl.engine.local.cpuinfo import cpu_model
from cfl.engine.rounds.runner import Runner
from tests.conftest import METHOD_STREAMS, method_spec, stream_for, tiny_config

#: method -> (last row of the accuracy matrix, upload bytes, download bytes, sum of |parameters|), at d4b1c84
BEFORE = {
    "fedavg": ([63.333333333333336, 56.666666666666664], 1364400, 1364400, 1005.4396976755379),
    "ewc": ([63.333333333333336, 56.666666666666664], 1364400, 1667600, 1005.4394494169374),
    "er": ([63.333333333333336, 33.333333333333336], 1364400, 1364400, 1005.9918575254151),
    "fedlwf": ([63.333333333333336, 56.666666666666664], 1364400, 1667600, 1005.4399391983825),
    "glfc": ([10.0, 30.0], 1949472, 2413402, 1034.7251279469301),
    "target": ([33.333333333333336, 0.0], 78968160, 96524856, 20377.88772619151),
    "mfcl": ([33.333333333333336, 0.0], 78968160, 96543080, 19866.17219831563),
    "fot": ([63.333333333333336, 36.666666666666664], 1562784, 1591800, 1005.1802643162864),
    "fedweit": ([49.16666666666667, 63.333333333333336], 4256396, 8144816, 3347.2626285865795),
}

#: (CPU model, torch version) -> method -> sum of |parameters| where it differs from the EPYC's at d4b1c84 (same
#: rows, same bytes): the generators of TARGET and MFCL amplify float32's last digits, which move with the CPU and
#: with torch's kernels; each measured at the base and at the branch of a change that kept every number (a tuple:
#: the VMs sold under one model name differ; each value was measured on one of them, at a base and its branch)
CHECKSUM_ON = {
    ("Intel(R) Xeon(R) Processor", "2.14.1+cu130"): {"target": 20374.098455733547, "mfcl": 19863.52786258161,
                                                     "fedweit": 3347.2627124159603},
    ("AMD EPYC", "2.14.1+cu130"): {"target": (20374.550998248706, 20377.88772619151),
                                   "mfcl": (19864.00244971161, 19866.17219831563)},
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_synchronous_run_gives_the_results_from_before_per_client_task_ends(name):
    scenario = METHOD_STREAMS.get(name, {}).get("scenario", "task")
    extra = {"weight_decay": 0.0} if name == "fedweit" else {}
    cfg = tiny_config(method=method_spec(name), num_clients=4, clients_per_round=3, eval_every=1, **extra)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = Runner(cfg, stream_for(name, scenario, num_tasks=2))
        runner.run()
    finally:
        torch.set_num_threads(threads)
    row, up, down, total = BEFORE[name]
    totals = CHECKSUM_ON.get((cpu_model(), torch.__version__), {}).get(name, total)
    assert runner.progress.acc_matrix[-1] == pytest.approx(row, abs=1e-9)
    assert (runner.comm.upload_bytes, runner.comm.download_bytes) == (up, down)
    checksum = sum(float(v.double().abs().sum()) for v in runner.params.values())
    assert any(checksum == pytest.approx(t, rel=1e-9) for t in (totals if isinstance(totals, tuple) else (totals,))), (
        checksum, totals)
