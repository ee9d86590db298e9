"""What FedWeIT sends, sparsified, and its exact size in bytes (Yoon et al., ICML 2021, section 3.3: the base is
sent masked by the top of its task mask, the task-adaptive parts are sparse).

The official code (``wyjeong/FedWeIT``, ``modules/federated.py`` ``get_weights``/``set_weights``,
``modules/train.py`` ``aggregate``, ``models/fedweit/client.py`` ``get_adaptives``):
- upload of the base: per layer, ``thres = sort(|mask logits|)[floor(n * client_sparsity)]`` over the ``n`` output
  units of the current task's mask, and the base's units with ``|mask| > thres`` are sent, the rest zeroed
  (``client_sparsity`` 0.3; the strict ``>`` keeps ``n - floor(n * s) - 1`` units when no values tie);
- the server averages each unit over the clients that sent it (unweighted; a unit nobody sent becomes 0), and a
  client keeps its own base wherever the global value is exactly 0;
- at a task's last round each client sends ``A^(t)`` pruned at ``|A| > lambda_l1``, the knowledge base of the
  next task.

Byte counts: ``value_bytes`` per sent value (4: float32). A row-sparse base (:func:`row_sparse_bytes`) is the kept
units' rows plus one bit per output unit; an element-sparse tensor (:func:`sparse_bytes`) is either a bitmap of
all its entries plus the nonzero values (``"bitmap"``) or, per nonzero, its value and an ``index_bytes`` flat
index (``"coo"``). These are cfl's encodings: the paper reports counts of nonzero values.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from cfl.models.fedweit_weight import per_unit

Encoding = Literal["bitmap", "coo"]
ENCODINGS: tuple[Encoding, ...] = ("bitmap", "coo")

#: the code's ``epsi``: added to the count of senders of each unit before dividing (a unit nobody sent: 0 / eps)
EPS = 1e-15


def kept_units(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool ``(n,)``: the units sent, ``scores > sort(scores)[floor(n * sparsity)]`` (the code passes
    ``|mask logits|``), ``0 <= sparsity < 1``."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"kept_units: sparsity must be in [0, 1), got {sparsity}")
    flat = scores.reshape(-1)
    threshold = flat.sort().values[math.floor(flat.numel() * sparsity)]
    return scores > threshold


def sparse_base(base: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``base`` ``(out, ...)`` with the output units outside ``keep`` ``(out,)`` zeroed: what the client uploads."""
    return base * per_unit(keep.to(base.dtype), base)


def aggregate_bases(bases: torch.Tensor, keeps: torch.Tensor) -> torch.Tensor:
    """The server's base: ``bases`` ``(C, out, ...)`` (already sparsified) summed and divided per output unit by
    the number of clients that sent it, ``keeps`` ``(C, out)`` (+ :data:`EPS`): units nobody sent are 0."""
    senders = keeps.to(bases.dtype).sum(0) + EPS
    return bases.sum(0) / per_unit(senders, bases[0])


def merge_base(local: torch.Tensor, global_base: torch.Tensor) -> torch.Tensor:
    """The client's base after the download: the global value, or its own where the global value is exactly 0."""
    return torch.where(global_base == 0, local, global_base)


def row_sparse_bytes(keep: torch.Tensor, row_numel: int, value_bytes: int = 4) -> int:
    """Bytes of a base sent as its kept output units' rows (``row_numel`` values each) plus a bitmap of the units."""
    units = keep.numel()
    return int(keep.sum()) * row_numel * value_bytes + math.ceil(units / 8)


def sparse_bytes(t: torch.Tensor, encoding: Encoding = "bitmap", value_bytes: int = 4, index_bytes: int = 4) -> int:
    """Bytes of ``t`` sent as its nonzero entries: ``"bitmap"`` a bit per entry plus the nonzero values,
    ``"coo"`` each nonzero's value and flat index."""
    nnz = int(torch.count_nonzero(t))
    if encoding == "bitmap":
        return math.ceil(t.numel() / 8) + nnz * value_bytes
    if encoding == "coo":
        return nnz * (value_bytes + index_bytes)
    raise ValueError(f"sparse_bytes: unknown encoding {encoding!r}; the encodings are {list(ENCODINGS)}")


def knowledge_base_bytes(entries: list[dict[str, torch.Tensor]], encoding: Encoding = "bitmap",
                         value_bytes: int = 4, index_bytes: int = 4) -> int:
    """Bytes of a knowledge base sent to one client: each entry (one client's pruned ``A`` per layer) element-sparse
    (:func:`sparse_bytes`)."""
    return sum(sparse_bytes(t, encoding, value_bytes, index_bytes) for entry in entries for t in entry.values())
