"""``server_event("before_task_end")``: the server's hook at a task end sees the task's final global
model (the last round's aggregate) and the classes seen so far, runs once per task end before the task-end broadcast is
read, writes the server state, and its wall time goes to ``method_stats``."""

from __future__ import annotations

import torch

from cfl.engine.rounds import runner as runner_module
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.task_end import end_tasks
from cfl.methods import METHODS
from cfl.methods.base import Method, Sends
from cfl.metrics.results import method_stats
from cfl.validation import from_dict
from tests.conftest import make_stream


class Teacher(Method):
    """Keeps the task's final model and classes; task-end participants read ``mark`` from the broadcast."""

    name = "teacher-probe"
    sends = Sends(server_events=("before_task_end",), broadcast={"task_end": ("mark",)}, client_events=("task_end",))

    def __init__(self, hparams, run_info) -> None:
        super().__init__(hparams, run_info)
        self.calls: list[tuple[int, dict, torch.Tensor, bool]] = []
        self.marks: list[float] = []


    def server_event(self, ctx):
        model, classes, server, task = ctx.model, ctx.classes, ctx.server, ctx.task  # noqa: F841
        self.calls.append((task, {k: v.detach().clone() for k, v in model.named_parameters()}, classes,
                           model.training))
        server["mark"] = torch.tensor(float(task + 1))

    def client_end(self, ctx):
        server = ctx.server
        self.marks.append(float(server["mark"]))


def _runner(num_tasks: int = 3) -> Runner:
    cfg = from_dict({"num_clients": 3, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
                     "method": {"name": "teacher-probe"}, "wandb": {"mode": "disabled"}})
    return Runner(cfg, make_stream("class", num_tasks=num_tasks, n_train=30, n_test=6))


def test_it_sees_each_task_final_global_model_once_before_the_task_end_broadcast(monkeypatch):
    with METHODS.temporarily("teacher-probe", Teacher):
        runner = _runner()
        finals: list[dict] = []

        def recording(run, *args) -> None:
            finals.append({k: v.clone() for k, v in runner.params.items()})  # the last round's aggregate
            end_tasks(run, *args)

        monkeypatch.setattr(runner_module, "end_tasks", recording)
        template = {k: v.detach().clone() for k, v in runner.model.named_parameters()}
        runner.run()
    method = runner.methods[0]
    assert [c[0] for c in method.calls] == [0, 1]  # every task end but the last's, once
    for (task, seen, classes, training), final in zip(method.calls, finals, strict=True):
        assert all(torch.equal(seen[k], final[k]) for k in final)
        assert not all(torch.equal(seen[k], template[k]) for k in template)  # trained, not the template
        assert classes.tolist() == list(range(3 * (task + 1)))  # 3 classes per task, class-incremental
        assert not training
    # the template is untouched: the hook gets a copy
    assert all(torch.equal(v, template[k]) for k, v in runner.model.named_parameters())
    # the 3 clients of each task end read the mark the hook had just written
    assert method.marks == [1.0] * 3 + [2.0] * 3


def test_its_wall_time_goes_to_the_method_stats():
    with METHODS.temporarily("teacher-probe", Teacher):
        runner = _runner(num_tasks=2)
        runner.run()
    stats = method_stats(runner.comm, runner.methods[0], runner.states[0])
    assert stats["before_task_end_seconds"] > 0
    assert runner.states[0].server["stats"]["before_task_end_seconds"] == stats["before_task_end_seconds"]
