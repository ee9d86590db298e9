"""The ``lr_groups`` config key: parameter-name prefix -> a learning rate of its own in place of ``lr``, the longest
matching prefix winning (:func:`lr_of`); every prefix must name some parameter of the run's model
(:func:`check_prefixes`). The local optimisers read it through :mod:`cfl.engine.local.local_optim`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cfl.config.schema import ConfigError


def lr_of(lr: float, groups: Mapping[str, float], name: str) -> float:
    """Parameter ``name``'s learning rate: that of its longest matching prefix in ``groups``, else ``lr``."""
    prefix = max((p for p in groups if name.startswith(p)), key=len, default=None)
    return lr if prefix is None else groups[prefix]


def check_empty_prefix(groups: Mapping[str, float]) -> None:
    """Refuse the prefix ``''``: every parameter matches it, which is what ``lr`` says."""
    if "" in groups:
        raise ConfigError(f"'lr_groups' has the empty prefix '' (lr {groups['']}), which every parameter matches; "
                          "set lr instead")


def check_prefixes(groups: Mapping[str, float], names: Iterable[str], model: str) -> None:
    """Refuse a prefix of ``groups`` that matches none of the model's parameter ``names``, listing the names' first
    components (and a few whole names)."""
    names = list(names)
    for prefix in groups:
        if any(n.startswith(prefix) for n in names):
            continue
        firsts = list(dict.fromkeys(n.split(".")[0] for n in names))
        examples = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise ConfigError(f"'lr_groups' prefix '{prefix}' matches no parameter of model {model}, whose parameter "
                          f"names start with: {', '.join(firsts)} (e.g. {examples}); fix or remove the prefix")
