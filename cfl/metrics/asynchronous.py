"""ACC, forgetting, backward transfer, AIA and forward transfer when clients switch tasks at their own rounds
(cfl/schedules.py).

From the run's evaluations (each: the global model's accuracy ``acc_e(j)`` on every task ``j`` some client has
started, after global round ``r_e``) and the plan (docs/concepts.md, "Metrics under a schedule"). ``l_j`` is the
evaluation at which task ``j`` counts as learned (``schedule.forgetting``, :meth:`cfl.schedules.Plan.learned`): the
first evaluation after the round at which its last holder left it (``last_finisher``, the default) or at which some
client first finished it (``first_finisher``, cfl's earlier reading); ``F`` the final evaluation:

* ``ACC = mean_j acc_F(j)`` over the tasks of ``F``;
* per task, ``FGT_j = acc_{l_j}(j) - acc_F(j)`` for the tasks learned before ``F``; ``FGT`` their mean (0 without
  any), ``BWT = -FGT``;
* ``AIA = mean_e mean_j acc_e(j)`` over the task-end evaluations ``e``: each distinct ``l_j`` before ``F``, and ``F``;
* ``FWT = mean_j (before_j - init_j)`` over the tasks first started after round 0, ``before_j`` the global model's
  accuracy on task ``j`` just before its first round (``acc_before_task``), ``init_j`` the initial model's
  (``acc_init``); None when a term was not measured (class-incremental runs) or no task started late;
* per client ``c`` with its own order ``o_c`` (``n_c`` tasks): its matrix ``a_c[i][k] = acc_{s_i}(o_c[k])``
  (``k <= i``), ``s_i`` the evaluation after its own switch from ``o_c[i]`` (``F`` for its last task); its
  ``ACC_c = mean_k a_c[n_c-1][k]``, ``FGT_c = mean_{i < n_c-1} (a_c[i][i] - a_c[n_c-1][i])``, ``BWT_c = -FGT_c``.

Under the synchronous schedule both readings of ``l_j`` are task ``j``'s final evaluation and ``F`` the last task's:
the formulas are :mod:`cfl.metrics.matrix`'s ACC, FGT, BWT, AIA and FWT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cfl.records.snapshot import Matrix
from cfl.schedules import Plan


def _by_round(evaluations: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last evaluation after each global round (1-based ``round``)."""
    return {e["round"]: e for e in evaluations}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _after(evaluations: list[dict[str, Any]], rnd: int) -> dict[str, Any]:
    """The first evaluation after 0-based global round ``rnd`` (1-based ``round`` > ``rnd``); the last one if none."""
    return next((e for e in evaluations if e["round"] > rnd), evaluations[-1])


def learned_evaluations(evaluations: list[dict[str, Any]], plan: Plan,
                        forgetting: str = "last_finisher") -> dict[int, dict[str, Any]]:
    """Task -> ``l_j``, the evaluation at which it counts as learned (module docstring), for the tasks learned."""
    return {j: _after(evaluations, r) for j, r in plan.learned(forgetting).items()}


def scheduled_matrix(evaluations: list[dict[str, Any]], plan: Plan, forgetting: str = "last_finisher") -> Matrix:
    """``a[j][k]``: the accuracy on task ``k`` at ``l_j`` (the final evaluation for a task never learned before
    the run's end), ``None`` for a task not started by then."""
    learned = learned_evaluations(evaluations, plan, forgetting)
    return [[learned.get(j, evaluations[-1])["acc"].get(str(k)) for k in range(plan.num_tasks)]
            for j in range(plan.num_tasks)]


def scheduled_forward_transfer(plan: Plan, before: Mapping[str, float] | Sequence[float | None] | None,
                               init: Sequence[float] | None) -> float | None:
    """GEM's FWT over the tasks first started after round 0 (module docstring); None without them or a term."""
    late = [j for j, r in plan.first_started().items() if r > 0]
    if not late or not init or before is None:
        return None
    get = before.get if isinstance(before, Mapping) else (lambda k: before[int(k)] if int(k) < len(before) else None)
    diffs = [(get(str(j)), init[j] if j < len(init) else None) for j in late]
    if any(b is None or r is None for b, r in diffs):
        return None
    return sum(b - r for b, r in diffs) / len(diffs)


def scheduled_metrics(evaluations: list[dict[str, Any]], plan: Plan, forgetting: str = "last_finisher",
                      before: Mapping[str, float] | Sequence[float | None] | None = None,
                      init: Sequence[float] | None = None) -> dict[str, Any]:
    """ACC, FGT, BWT, AIA, FWT (global) and ACC, FGT, BWT per client of a run under ``plan`` (module docstring);
    ``forgetting``: ``schedule.forgetting``; ``before``/``init``: ``acc_before_task``/``acc_init`` (FWT)."""
    at, final = _by_round(evaluations), evaluations[-1]
    last = final["round"]
    acc_final = {int(k): v for k, v in final["acc"].items()}
    learned = {j: e for j, e in learned_evaluations(evaluations, plan, forgetting).items() if e["round"] < last}
    fgt_task = {j: e["acc"][str(j)] - acc_final[j] for j, e in sorted(learned.items())}
    fgt = _mean(list(fgt_task.values()))
    ends = [*sorted({e["round"]: e for e in learned.values()}.values(), key=lambda e: e["round"]), final]
    aia = _mean([_mean(list(e["acc"].values())) for e in ends])
    clients: dict[str, Any] = {}
    for c, line in enumerate(plan.timelines):
        order = plan.held(c)
        evals = [at.get(s, final) for s in line.starts[1: len(order)]] + [final]
        matrix = [[e["acc"].get(str(order[k])) if k <= i else None for k in range(len(order))]
                  for i, e in enumerate(evals)]
        n = len(order)
        c_fgt = _mean([matrix[i][i] - matrix[n - 1][i] for i in range(n - 1)])
        clients[str(c)] = {"order": order, "acc_matrix": matrix, "acc": _mean([matrix[n - 1][k] for k in range(n)]),
                           "fgt": c_fgt, "bwt": -c_fgt}
    return {"name": plan.name, "rounds": plan.rounds, "forgetting": forgetting,
            "acc": _mean(list(acc_final.values())), "fgt": fgt, "bwt": -fgt,
            "aia": aia, "fwt": scheduled_forward_transfer(plan, before, init),
            "fgt_per_task": {str(j): v for j, v in fgt_task.items()},
            "learned_round": {str(j): e["round"] for j, e in sorted(learned.items())},
            "client_acc_mean": _mean([v["acc"] for v in clients.values()]),
            "client_fgt_mean": _mean([v["fgt"] for v in clients.values()]),
            "client_bwt_mean": _mean([v["bwt"] for v in clients.values()]),
            "clients": clients}
