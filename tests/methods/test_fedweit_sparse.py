"""FedWeIT's sparse uploads (the official code's rules) and their exact byte counts, on hand values."""

from __future__ import annotations

import pytest
import torch

from cfl.ops.fedweit_sparse import (
    aggregate_bases,
    kept_units,
    knowledge_base_bytes,
    merge_base,
    row_sparse_bytes,
    sparse_base,
    sparse_bytes,
)

SCORES = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 1.0])


def test_kept_units_strictly_above_the_code_threshold():
    """10 units, sparsity 0.3: the threshold is the sorted value at floor(3) = 0.4, so 6 units (not 7) are kept."""
    keep = kept_units(SCORES, 0.3)
    assert keep.tolist() == [True, False, True, False, True, False, True, False, True, True]
    assert int(kept_units(SCORES, 0.0).sum()) == 9  # even sparsity 0 drops the smallest unit (the code's quirk)


def test_kept_units_refuses_a_sparsity_outside_0_1():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        kept_units(SCORES, 1.0)


def test_sparse_base_zeroes_whole_output_units():
    base = torch.arange(1.0, 7.0).view(3, 2)
    sent = sparse_base(base, torch.tensor([True, False, True]))
    assert torch.equal(sent, torch.tensor([[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]))
    conv = sparse_base(torch.ones(2, 3, 2, 2), torch.tensor([False, True]))
    assert conv[0].abs().sum() == 0 and torch.equal(conv[1], torch.ones(3, 2, 2))


def test_aggregate_averages_each_unit_over_its_senders():
    """Unit 0 sent by both (1 and 3: 2), unit 1 by client 0 only (2: 2), unit 2 by nobody (0)."""
    bases = torch.tensor([[[1.0], [2.0], [0.0]], [[3.0], [0.0], [0.0]]], dtype=torch.float64)
    keeps = torch.tensor([[True, True, False], [True, False, False]])
    assert torch.allclose(aggregate_bases(bases, keeps), torch.tensor([[2.0], [2.0], [0.0]], dtype=torch.float64))


def test_merge_keeps_the_local_base_where_the_global_one_is_zero():
    merged = merge_base(torch.tensor([5.0, 6.0, 7.0]), torch.tensor([2.0, 0.0, 1.0]))
    assert torch.equal(merged, torch.tensor([2.0, 6.0, 1.0]))


def test_row_sparse_bytes():
    """6 of 10 units of a 784-input layer: 6 * 784 float32 values and a 2-byte bitmap of the 10 units."""
    assert row_sparse_bytes(kept_units(SCORES, 0.3), 784) == 6 * 784 * 4 + 2
    assert row_sparse_bytes(torch.ones(16, dtype=torch.bool), 3, value_bytes=2) == 16 * 3 * 2 + 2


def test_sparse_bytes_both_encodings():
    t = torch.zeros(4, 5)
    t[0, 1], t[2, 2], t[3, 4] = 1.0, -2.0, 0.5  # 3 nonzeros of 20 entries
    assert sparse_bytes(t) == 3 + 3 * 4  # a 20-bit bitmap in 3 bytes, 3 float32 values
    assert sparse_bytes(t, "coo") == 3 * (4 + 4)
    assert sparse_bytes(t, "coo", value_bytes=2, index_bytes=8) == 3 * 10
    with pytest.raises(ValueError, match="unknown encoding 'csr'"):
        sparse_bytes(t, "csr")  # type: ignore[arg-type]


def test_knowledge_base_bytes_sums_every_entry_and_layer():
    a = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # 1 nonzero of 4: 1 + 4 bytes
    b = torch.ones(9)  # 9 of 9: 2 + 36 bytes
    assert knowledge_base_bytes([{"l1": a, "l2": b}, {"l1": a, "l2": torch.zeros(9)}]) == (5 + 38) + (5 + 2)
    assert knowledge_base_bytes([]) == 0
