"""Task-end model downloads: counted for methods that need the final global model, shown as their own line."""

import pytest

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method, takes_part_at_task_end
from cfl.metrics.results import build_results
from cfl.validation import from_dict
from tests.conftest import METHOD_CONFIGS, method_spec, stream_for

CLIENT_END_METHODS = sorted(name for name, cls in METHODS.items() if cls.client_end is not Method.client_end)


def _run(method: str) -> tuple[Runner, dict]:
    cfg = from_dict({"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 1, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}, "method": method_spec(method), **METHOD_CONFIGS.get(method, {})})
    runner = Runner(cfg, stream_for(method, "domain", num_tasks=3))
    runner.run()
    return runner, build_results(runner.snapshot(), 0.0)


@pytest.mark.parametrize("method", CLIENT_END_METHODS)
def test_task_end_model_downloads_are_a_line_of_their_own(method):
    runner, results = _run(method)
    m = runner.methods[0]
    if not takes_part_at_task_end(m):  # FedCurv: client_end at rounds only, no task-end line
        assert "task_end" not in m.sends.client_events
        assert "task_end_model_download_bytes" not in results["method_stats"][method]
        return
    participants = 5 if m.task_end_clients is None else m.task_end_clients
    # 2 task ends of 3 tasks
    expected = 2 * participants * runner.model_bytes if m.sends.downloads_model_at_task_end else 0
    line = results["method_stats"][method]["task_end_model_download_bytes"]
    assert line == expected
    rounds = 3 * 3 * runner.model_bytes  # 3 rounds, 3 clients, nothing else broadcast before the task ends
    assert results["download_bytes"] >= rounds + line
    if method == "ewc":  # nothing else is sent: the totals are the rounds' models plus this line exactly
        assert results["download_bytes"] == rounds + line


def test_ledger_lines_survive_a_checkpoint():
    runner, _ = _run("ewc")
    again = Runner(runner.cfg, runner.stream)
    again.comm.load_state_dict(runner.comm.state_dict())
    assert again.comm.lines == runner.comm.lines and again.comm.lines
