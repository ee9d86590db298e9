"""``Method.sends.client_events``: the engine calls ``client_end`` for the declared events only."""

from __future__ import annotations

import pytest

from cfl.engine.rounds.runner import Runner
from cfl.methods.base import Method, Sends
from cfl.validation import from_dict
from tests.conftest import METHOD_CONFIGS, method_spec, stream_for
from tests.metrics.test_comm_lines import CLIENT_END_METHODS


@pytest.mark.parametrize("method", CLIENT_END_METHODS)
def test_client_end_runs_for_the_declared_events_only(method):
    cfg = from_dict({"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}, "method": method_spec(method), **METHOD_CONFIGS.get(method, {})})
    runner = Runner(cfg, stream_for(method, "domain", num_tasks=2))
    m = runner.methods[0]
    seen: list[str] = []
    real = m.client_end

    def recording(ctx):  # noqa: ANN001, ANN202
        seen.append(ctx.event)
        return real(ctx)

    m.client_end = recording
    runner.run()
    assert set(seen) == set(m.sends.client_events)  # every declared event is reached in 2 tasks x 2 rounds
    rounds = 2 * 2 * 2 if "round" in m.sends.client_events else 0  # 2 tasks x 2 rounds x 2 kept clients
    assert seen.count("round") == rounds


def test_an_unknown_client_event_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"client_events names the event\(s\) \['epoch'\]; they are "
                                        r"\['round', 'task_end'\]"):
        type("Bad", (Method,), {"name": "bad", "sends": Sends(client_events=("round", "epoch"))})
