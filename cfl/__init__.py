"""cfl: a continual federated learning benchmark (tasks x rounds x clients, methods as plugins)."""

__version__ = "0.1.0"
