"""The order of a report's rows: within each stream and partition, the methods named first (the baseline first),
then the others as :func:`cfl.report.groups.group_runs` sorts them. By default FedAvg leads when present.

A name matches a row when it is, ignoring case, the row's method label (``ewc+fedprox``), its label as the
table's method column shows it (``fedavg lr=0.05``), its config ``label`` (a sweep variant's, ``DER++``), its
method's display name (``EWC+FL``) or its label as figure legends show it (``FedProx mu=1``).
"""

from __future__ import annotations

from cfl.config.keys import ConfigError
from cfl.report.groups import Group
from cfl.report.labels import backbone_suffix, display_name, row_label

#: the default order: the FedAvg rows first (when the table has any), the rest as sorted
DEFAULT_ORDER = ("fedavg",)


def names_of(group: Group) -> set[str]:
    """Every name a row answers to in ``--order``, in lower case."""
    names = {group.method, group.label, display_name(group.method, group.recorded),
             row_label(group.method, group.differs, group.name, display=True, recorded=group.recorded)}
    if group.name is not None:  # the name shown and the config label (without the backbone's flag)
        names.update({group.name, group.name.removesuffix(backbone_suffix(group.runs[0].results))})
    return {n.casefold() for n in names}


def matches(name: str, group: Group) -> bool:
    """``name`` is one of the names the row answers to (:func:`names_of`)."""
    return name.casefold() in names_of(group)


def order_rows(groups: list[Group], order: list[str] | None = None) -> list[Group]:
    """``groups`` (sorted) with the rows matching ``order``'s names first, in that order, within each stream and
    partition. ``order`` None: :data:`DEFAULT_ORDER`; a name given that matches no row is refused."""
    names = list(DEFAULT_ORDER if order is None else order)
    if order is not None:
        unmatched = [n for n in names if not any(matches(n, g) for g in groups)]
        if unmatched:
            labels = sorted({g.label for g in groups})
            raise ConfigError(f"--order names {', '.join(repr(n) for n in unmatched)}, which no row has; name a "
                              f"row as the method column shows it ({', '.join(labels)}), its method, its config "
                              "label or its display name as the figure legends show it")

    def rank(g: Group) -> int:
        return next((i for i, n in enumerate(names) if matches(n, g)), len(names))

    return sorted(groups, key=lambda g: (g.stream, g.partition, rank(g)))  # stable: the rest keep their order
