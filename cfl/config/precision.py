"""The ``precision`` config key's values, read where configs are checked (no torch needed): float32 throughout,
or bfloat16 products over float32 weights (:mod:`cfl.engine.local.precision` does the casting)."""

from __future__ import annotations

from typing import Any

from cfl.config.schema import ConfigError

#: the values of the ``precision`` config key (Lightning's spelling): float32 throughout, or bf16 products
PRECISIONS: tuple[int | str, ...] = (32, "bf16-mixed")
MIXED = "bf16-mixed"


def parse_precision(value: Any, key: str = "precision") -> int | str:
    """``32`` or ``"bf16-mixed"`` from a config value (``32`` may come as the string ``"32"``)."""
    if value == 32 and not isinstance(value, (bool, float)) or value == "32":
        return 32
    if value == MIXED:
        return MIXED
    raise ConfigError(f"'{key}' must be 32 (float32) or bf16-mixed (bfloat16 products, float32 weights), "
                      f"got {value!r}")


def is_mixed(precision: int | str) -> bool:
    return precision == MIXED
