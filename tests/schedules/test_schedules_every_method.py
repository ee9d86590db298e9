"""Every registered method under the staggered, paced and per-client-order schedules runs (batched equal to sequential;
a checkpoint taken between two clients' switches resumes bit for bit) or is refused with its reason."""

from __future__ import annotations

import pytest

from cfl.config.schema import ConfigError
from cfl.engine.stores import checkpoint
from cfl.methods import METHODS
from cfl.schedule_checks import schedules_allowed
from tests.conftest import METHOD_STREAMS, method_spec, stream_for, tiny_config
from tests.engine.test_checkpoint import assert_same_run, run_to_end

SCHEDULES_RUN = {"staggered": {"name": "staggered", "group": 2, "offset": 1, "every": 2},
                 "paced": {"name": "paced", "group": 2, "offset": 1, "every": 2},
                 "per_client_order": {"name": "per_client_order", "every": 2}}


def _config(name: str, schedule: dict, **kw: object):
    scenario = METHOD_STREAMS.get(name, {}).get("scenario", "task")
    return tiny_config(method=method_spec(name), schedule=schedule, num_clients=4, clients_per_round=3,
                       eval_every=1, **kw), stream_for(name, scenario, num_tasks=2)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES_RUN))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_runs_or_refuses_each_schedule(name, schedule, tmp_path):
    allowed = schedules_allowed(METHODS[name], method_spec(name))  # the method at its defaults
    try:
        cfg, stream = _config(name, SCHEDULES_RUN[schedule])
    except ConfigError as err:  # refused at validation, with the method's reason
        assert allowed and schedule not in allowed
        assert f"method {name} runs under schedule {' or '.join(allowed)} only: " \
               f"{METHODS[name].requires.schedules_why}" in str(err)
        return
    assert not allowed or schedule in allowed
    whole = run_to_end(cfg, stream)
    assert whole.progress.global_round == whole.plan.rounds
    if schedule == "staggered":  # after round 2 clients 0-1 have switched, clients 2-3 not yet
        switched = whole.plan.switches()
        assert [c for c, _ in switched[1]] == [0, 1] and 2 not in {c for c, _ in switched[1]}
        half = run_to_end(cfg, stream, stop_after=2)
        checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
        assert_same_run(whole, run_to_end(cfg, stream, payload=checkpoint.load(tmp_path)))
    else:
        if schedule == "paced":  # clients 2-3 switch after round 0, clients 0-1 after round 1
            assert whole.plan.switches()[0] == [(2, 0), (3, 0)]
        sequential = run_to_end(*_config(name, SCHEDULES_RUN[schedule], client_execution="sequential"))
        for k in whole.params:
            assert (whole.params[k] - sequential.params[k]).abs().max() < 1e-4, k
        assert [e["round"] for e in whole.progress.evaluations] == [e["round"] for e in
                                                                    sequential.progress.evaluations]
