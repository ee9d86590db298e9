"""ACC, forgetting and backward transfer when clients switch tasks at their own rounds (cfl/schedules.py).

From the run's evaluations (each: the global model's accuracy ``acc_e(j)`` on every task ``j`` some client has
started, after global round ``r_e``) and the plan (docs/concepts.md, "Metrics under a schedule"):

* ``ACC = mean_j acc_F(j)`` over the tasks of the final evaluation ``F``;
* per task, ``FGT_j = acc_{f_j}(j) - acc_F(j)`` with ``f_j`` the evaluation after the round where some client first
  finished task ``j`` (switched away from it), for the tasks first finished before ``F``; ``FGT`` their mean (0
  without any), ``BWT = -FGT``;
* per client ``c`` with its own order ``o_c`` (``n_c`` tasks): its matrix ``a_c[i][k] = acc_{s_i}(o_c[k])``
  (``k <= i``), ``s_i`` the evaluation after its own switch from ``o_c[i]`` (``F`` for its last task); its
  ``ACC_c = mean_k a_c[n_c-1][k]``, ``FGT_c = mean_{i < n_c-1} (a_c[i][i] - a_c[n_c-1][i])``, ``BWT_c = -FGT_c``.

Under the synchronous schedule ``f_j`` is task ``j``'s final evaluation and ``F`` the last task's: the formulas
are :mod:`cfl.metrics.matrix`'s ACC, FGT and BWT.
"""

from __future__ import annotations

from typing import Any

from cfl.records.snapshot import Matrix
from cfl.schedules import Plan


def _by_round(evaluations: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last evaluation after each global round (1-based ``round``)."""
    return {e["round"]: e for e in evaluations}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def scheduled_matrix(evaluations: list[dict[str, Any]], plan: Plan) -> Matrix:
    """``a[j][k]``: the accuracy on task ``k`` at the evaluation where task ``j`` was first finished (the final
    evaluation for a task no client finished), ``None`` for a task not started by then."""
    at, final = _by_round(evaluations), evaluations[-1]
    finished = plan.first_finished()
    rows = []
    for j in range(plan.num_tasks):
        e = at.get(finished[j] + 1, final) if j in finished else final
        rows.append([e["acc"].get(str(k)) for k in range(plan.num_tasks)])
    return rows


def scheduled_metrics(evaluations: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """ACC, FGT, BWT (global and per client) of a run under ``plan`` (module docstring)."""
    at, final = _by_round(evaluations), evaluations[-1]
    last = final["round"]
    acc_final = {int(k): v for k, v in final["acc"].items()}
    fgt_task = {j: at[r + 1]["acc"][str(j)] - acc_final[j] for j, r in sorted(plan.first_finished().items())
                if r + 1 < last and r + 1 in at}
    fgt = _mean(list(fgt_task.values()))
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
    return {"name": plan.name, "rounds": plan.rounds, "acc": _mean(list(acc_final.values())), "fgt": fgt, "bwt": -fgt,
            "fgt_per_task": {str(j): v for j, v in fgt_task.items()},
            "client_acc_mean": _mean([v["acc"] for v in clients.values()]),
            "client_fgt_mean": _mean([v["fgt"] for v in clients.values()]),
            "client_bwt_mean": _mean([v["bwt"] for v in clients.values()]),
            "clients": clients}
