"""Streams from and to Avalanche: ``from_avalanche(benchmark)`` -> cfl stream, ``to_avalanche(stream)``
-> Avalanche benchmark (docs/streams.md). Avalanche itself is imported only when a function needs it."""

from cfl.data.avalanche_in import from_avalanche
from cfl.data.avalanche_out import to_avalanche

__all__ = ["from_avalanche", "to_avalanche"]
