"""Rows whose accuracy matrices equal FedAvg's under the same settings: a method that changed nothing
(EWC at its default ``lam`` on class-incremental split-fmnist gives FedAvg's matrix digit for digit).

A row is marked when a FedAvg row has the same config but for the method (the keys ``method.*``, ``plugins.*``,
``aggregator.*`` and ``loss``, which make the method label) and, in every seed the two rows share (one at
least), the same ``acc_matrix`` exactly. The table shows :data:`MARK` after the row's label and explains it in
:func:`footnote`.
"""

from __future__ import annotations

from typing import Any

from cfl.report.groups import Group, Run, compared_keys

MARK = "[=FedAvg]"
#: the keys that make a run's method label: a row is compared with the FedAvg row equal in every other key
METHOD_KEY_PREFIXES = ("method.", "plugins.", "aggregator.")
METHOD_KEYS = ("loss",)
FEDAVG = "fedavg"


def settings(run: Run) -> dict[str, Any]:
    """The run's compared keys less those of its method."""
    return {k: v for k, v in compared_keys(run).items()
            if k not in METHOD_KEYS and not k.startswith(METHOD_KEY_PREFIXES)}


def matrices(group: Group) -> dict[int, Any]:
    return {r.seed: r.results.get("acc_matrix") for r in group.runs if isinstance(r.results.get("acc_matrix"), list)}


def same_seeds(group: Group, fedavg: Group) -> list[int]:
    """The seeds both groups ran, when every one of them has the same accuracy matrix in both; else []."""
    mine, theirs = matrices(group), matrices(fedavg)
    shared = sorted(set(mine) & set(theirs))
    return shared if shared and all(mine[s] == theirs[s] for s in shared) else []


def mark_same_as_fedavg(groups: list[Group]) -> None:
    """Set each group's ``same_as_fedavg`` to the seeds in which it gave FedAvg's accuracy matrices."""
    fedavg = [g for g in groups if g.method == FEDAVG and g.runs]
    if not fedavg:
        return
    for group in groups:
        if group.method == FEDAVG or not group.runs:
            continue
        mine = settings(group.runs[0])
        for other in fedavg:
            if settings(other.runs[0]) == mine:
                group.same_as_fedavg = same_seeds(group, other)
                break


def footnote(groups: list[Group]) -> str:
    """The explanation of :data:`MARK`, or "" when no row has it."""
    marked = [g for g in groups if g.same_as_fedavg]
    if not marked:
        return ""
    seeds = sorted({s for g in marked for s in g.same_as_fedavg})
    return (f"{MARK}: the accuracy matrices equal FedAvg's digit for digit under the same settings (the same config "
            f"but the method; seed(s) {', '.join(map(str, seeds))}): the method changed nothing here, e.g. a penalty "
            "too weak for the loss (results.json: method_stats.<method>.penalty_share)")
