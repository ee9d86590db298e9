"""The order of a report's rows: within each stream and partition, the methods named first (the baseline first),
then the others as :func:`cfl.report.groups.group_runs` sorts them. By default FedAvg leads when present."""

from __future__ import annotations

from cfl.config import ConfigError
from cfl.report.groups import Group

#: the default order: the FedAvg rows first (when the table has any), the rest as sorted
DEFAULT_ORDER = ("fedavg",)


def matches(name: str, group: Group) -> bool:
    """``name`` is the group's method label (``ewc+fedprox``) or its whole row label (``fedavg lr=0.05``)."""
    return name in (group.method, group.label)


def order_rows(groups: list[Group], order: list[str] | None = None) -> list[Group]:
    """``groups`` (sorted) with the rows matching ``order``'s names first, in that order, within each stream and
    partition. ``order`` None: :data:`DEFAULT_ORDER`; a name given that matches no row is refused."""
    names = list(DEFAULT_ORDER if order is None else order)
    if order is not None:
        unmatched = [n for n in names if not any(matches(n, g) for g in groups)]
        if unmatched:
            methods = sorted({g.method for g in groups})
            raise ConfigError(f"--order names {', '.join(repr(n) for n in unmatched)}, which no row has; name a "
                              f"method ({', '.join(methods)}) or a whole row label as the method column shows it")

    def rank(g: Group) -> int:
        return next((i for i, n in enumerate(names) if matches(n, g)), len(names))

    return sorted(groups, key=lambda g: (g.stream, g.partition, rank(g)))  # stable: the rest keep their order
