"""FedLwF (LwF on each client) and the distillation op it shares with FLwF-2T: hand-computed loss and gradient,
the old heads only, the teacher taken at the task end, and a run on a tiny stream."""

import math

import pytest
import torch
from torch.func import functional_call

from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientData
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.ops.distill import Teacher, distillation, head_weights, soft_kl
from tests.conftest import make_stream, run_both_paths, tiny_config


def test_soft_kl_by_hand():
    # T = 2; teacher logits (0, 2 ln 3) -> softmax((0, ln 3)) = p = (1/4, 3/4); student (0, 0) -> q = (1/2, 1/2)
    # KL(p || q) = 1/4 ln(1/2) + 3/4 ln(3/2) = -0.1732868 + 0.3040988 = 0.1308120
    teacher = torch.tensor([[0.0, 2 * math.log(3.0)]], dtype=torch.float64)
    student = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    kl = soft_kl(teacher, student, 2.0)
    assert kl.shape == (1,)
    assert kl.item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-12)
    assert kl.item() == pytest.approx(0.1308120, abs=1e-7)
    # d KL / d student = (q - p) / T = ((1/2 - 1/4) / 2, (1/2 - 3/4) / 2) = (0.125, -0.125)
    kl.sum().backward()
    assert torch.allclose(student.grad, torch.tensor([[0.125, -0.125]], dtype=torch.float64), atol=1e-12)
    # zero at the teacher, whatever T
    assert soft_kl(teacher, teacher, 0.5).abs().max() < 1e-12


def test_soft_kl_gradient_matches_finite_differences():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    student = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: soft_kl(teacher, s, 1.7), (student,))


def test_head_weights():
    assert head_weights(3, "task", 0, "cpu").tolist() == [1.0, 0.0, 0.0]
    assert head_weights(3, "task", 1, "cpu").tolist() == [1.0, 1.0, 0.0]
    assert head_weights(3, "domain", 1, "cpu").tolist() == [1.0]
    assert head_weights(3, "class", 2, "cpu").tolist() == [1.0]


def _cfg(**kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "fedlwf"}}
    base.update(kw)
    return tiny_config(**base)


def _after_task0(scenario="task", **method):
    """A runner that trained task 0 and ran its task end; its first method and client 0's state."""
    runner = Runner(_cfg(method={"name": "fedlwf", **method}), make_stream(scenario, num_tasks=3))
    for rnd in range(2):
        runner.run_round(0, rnd)
    runner.task_end(0)
    return runner, runner.methods[0], runner.states[0].clients.get(0)


def test_the_teacher_is_the_final_global_model_of_the_task_on_every_client():
    runner, _, _ = _after_task0()
    clients = runner.states[0].clients
    assert sorted(clients.ids()) == [0, 1, 2, 3]  # sampled or not
    for c in clients.ids():
        state = clients.get(c)
        assert all(torch.equal(state["teacher"][k], runner.params[k]) for k in runner.params)
        assert state["heads"].tolist() == [1.0, 0.0, 0.0]
    before = {k: v.clone() for k, v in runner.params.items()}
    runner.run_round(1, 0)  # training moves the global model, not the teacher (a copy, not a view)
    assert any(not torch.equal(runner.params[k], before[k]) for k in before)
    assert all(torch.equal(clients.get(0)["teacher"][k], before[k]) for k in before)


def test_extra_loss_is_lam_times_the_old_heads_kl_by_hand():
    runner, lwf, state = _after_task0(lam=2.5, temperature=3.0)
    x, t = make_stream("task", num_tasks=3).tasks[1].train_x[:5], torch.ones(5, dtype=torch.long)
    assert float(lwf.loss(LossContext("extra", runner.params, x, t, torch.ones(len(x)), {},
                                      state)).extra.abs().max()) < 1e-6  # at the teacher: 0
    moved = {k: v + 0.3 * torch.randn_like(v) for k, v in runner.params.items()}
    head0 = torch.zeros_like(t)  # lam * KL_T on head 0, the only finished task's head
    by_hand = 2.5 * soft_kl(functional_call(runner.model, runner.params, (x, head0)),
                            functional_call(runner.model, moved, (x, head0)), 3.0)
    got = lwf.loss(LossContext("extra", moved, x, t, torch.ones(len(x)), {}, state)).extra
    assert got.shape == (5,) and float(got.min()) > 0
    assert torch.allclose(got, by_hand, atol=1e-6)
    # only the old head (0) is distilled: the current task's head 1 alone costs nothing
    head1 = dict(runner.params)
    head1["head.weight"] = head1["head.weight"].clone()
    head1["head.weight"][1] += 1.0
    assert float(lwf.loss(LossContext("extra", head1, x, t, torch.ones(len(x)), {}, state)).extra.abs().max()) < 1e-6


def test_the_gradient_pulls_the_student_back_to_the_teacher():
    runner, lwf, state = _after_task0("domain")
    x, t = make_stream("domain", num_tasks=3).tasks[1].train_x[:8], torch.ones(8, dtype=torch.long)
    moved = {k: (v + 0.2 * torch.randn_like(v)).requires_grad_() for k, v in runner.params.items()}
    loss = lwf.loss(LossContext("extra", moved, x, t, torch.ones(len(x)), {}, state)).extra.mean()
    grads = torch.autograd.grad(loss, list(moved.values()))
    # a small step down the gradient lowers the distillation loss; the teacher gets no gradient
    step = {k: (v - 0.05 * g).detach() for (k, v), g in zip(moved.items(), grads, strict=True)}
    assert float(lwf.loss(LossContext("extra", step, x, t, torch.ones(len(x)), {},
                                      state)).extra.mean()) < float(loss.detach())
    assert all(not v.requires_grad for v in state["teacher"].values())


def test_no_teacher_before_the_first_task_end():
    runner = Runner(_cfg(), make_stream("task", num_tasks=2))
    lwf, x = runner.methods[0], torch.zeros(4, 12)
    assert torch.equal(lwf.loss(LossContext("extra", runner.params, x, torch.zeros(4, dtype=torch.long),
                                            torch.ones(len(x)), {}, {})).extra, torch.zeros(4))


def test_the_teacher_follows_the_latest_task_end():
    runner, lwf, state = _after_task0()
    task1 = runner.stream.tasks[1]
    later = {k: v + 1.0 for k, v in runner.params.items()}
    lwf.client_end(ClientEndContext("task_end", runner.model, later, ClientData(task1.train_x, task1.train_y, 1),
                                    state, {}, None))
    assert all(torch.equal(state["teacher"][k], later[k]) for k in later)
    assert state["heads"].tolist() == [1.0, 1.0, 0.0]


def test_distillation_sums_weighted_teachers():
    runner, _, state = _after_task0("domain")
    x, t = runner.stream.tasks[1].train_x[:6], torch.ones(6, dtype=torch.long)
    moved = {k: v + 0.3 * torch.randn_like(v) for k, v in runner.params.items()}
    one = distillation(runner.model, moved, x, t, [Teacher(state["teacher"], state["heads"], 1.0)], 2.0)
    two = distillation(runner.model, moved, x, t, [Teacher(state["teacher"], state["heads"], 0.25),
                                                    Teacher(state["teacher"], 0 * state["heads"], 9.0),
                                                    Teacher(state["teacher"], state["heads"], 0.5)], 2.0)
    assert torch.allclose(two, 0.75 * one, atol=1e-7)


def test_the_teachers_run_in_eval_mode_and_the_student_in_training_mode():
    """LwF records the old network's responses: no dropout in a teacher's forward, the student's as trained."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    model.forward = lambda x, _head: torch.nn.Sequential.forward(model, x)  # the engine's call: model(x, head)
    seen = []
    model[0].register_forward_pre_hook(lambda module, _args: seen.append(module.training))
    params = {k: v.detach() for k, v in model.named_parameters()}
    model.train()
    distillation(model, params, torch.randn(5, 3), torch.zeros(5, dtype=torch.long),
                 [Teacher(params, torch.ones(1), 1.0), Teacher(params, torch.ones(1), 1.0)], 2.0)
    assert seen == [True, False, False] and model.training


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_runs_end_to_end_and_batched_equals_sequential(scenario):
    batched, _ = run_both_paths(_cfg, make_stream(scenario, num_tasks=3))
    assert batched.engine_path.path == "vmap"
    assert batched.progress.acc_matrix[2][0] is not None


def test_lambda_zero_trains_as_fedavg():
    stream = make_stream("task", num_tasks=2)
    lwf = Runner(_cfg(method={"name": "fedlwf", "lam": 0.0}, client_execution="sequential"), stream)
    avg = Runner(_cfg(method={"name": "fedavg"}, client_execution="sequential"), stream)
    lwf.run()
    avg.run()
    assert all(torch.allclose(lwf.params[k], avg.params[k], atol=1e-6) for k in avg.params)


def test_distillation_keeps_the_old_outputs_closer_than_fedavg():
    """What LwF is for: after task 1, the global model's outputs on task 0's inputs moved less from the end of
    task 0 than FedAvg's did (KL on task 0's test inputs, T = 1)."""
    stream = make_stream("domain", num_tasks=2, seed=1)
    x = stream.tasks[0].test_x
    moved = {}
    for method in ({"name": "fedavg"}, {"name": "fedlwf", "lam": 5.0}):
        runner = Runner(_cfg(method=method, lr=0.2), stream)
        runner.should_stop = lambda r=runner: r.progress.task == 1 and r.progress.round_in_task == 0
        runner.run()  # stops after task 0's task end
        end_of_task0 = {k: v.clone() for k, v in runner.params.items()}
        runner.should_stop = lambda: False
        runner.run()
        task = torch.zeros(len(x), dtype=torch.long)
        kl = soft_kl(functional_call(runner.model, end_of_task0, (x, task)),
                     functional_call(runner.model, runner.params, (x, task)), 1.0)
        moved[method["name"]] = float(kl.mean())
    assert moved["fedlwf"] < 0.8 * moved["fedavg"], moved  # measured: 0.018 against 0.028
