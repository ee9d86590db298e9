"""Method registry: one line per method. See docs/plugins.md to add your own."""

from __future__ import annotations

from cfl.methods.base import Method
from cfl.methods.fedavg import FedAvg
from cfl.methods.fedprox import FedProx

METHODS: dict[str, type[Method]] = {
    FedAvg.name: FedAvg,
    FedProx.name: FedProx,
}


def register(cls: type[Method]) -> type[Method]:
    """Register a method class from outside the package (a user's plugin): ``@register``."""
    METHODS[cls.name] = cls
    return cls
