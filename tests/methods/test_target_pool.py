"""TARGET's synthetic pool: 8-bit images as the official code's PNG round trip gives them, its capacity, its bytes,
and the clients' synthetic batch size."""

from __future__ import annotations

import pytest
import torch

from cfl.ops.synthetic_pool import SyntheticPool, client_steps_per_epoch, client_synthetic_batch


def test_images_are_truncated_to_eight_bits_after_clamping():
    """0.5 -> floor(127.5) = 127; 1.2 -> 255; -0.2 -> 0; 0.999 -> 254."""
    pool = SyntheticPool(10)
    pool.add(torch.tensor([0.5, 1.2, -0.2, 0.999]).view(1, 1, 2, 2))
    assert (pool.as_float() * 255).round().flatten().tolist() == [127, 255, 0, 254]
    assert pool.nbytes == 4  # one byte a pixel


def test_unquantised_pool_keeps_floats():
    pool = SyntheticPool(10, quantize=False)
    pool.add(torch.tensor([0.5, 1.2]).view(1, 1, 1, 2))
    assert pool.as_float().flatten().tolist() == [0.5, 1.0] and pool.nbytes == 8


def test_the_pool_keeps_the_first_images_up_to_its_capacity():
    pool = SyntheticPool(4)
    pool.add(torch.full((3, 1, 1, 1), 0.2))
    pool.add(torch.full((3, 1, 1, 1), 0.8))
    assert len(pool) == 4 and (pool.as_float().flatten() * 255).round().tolist() == [51, 51, 51, 204]


def test_draws_are_without_replacement():
    pool = SyntheticPool(8)
    pool.add(torch.arange(8.0).view(8, 1, 1, 1) / 255)
    drawn = pool.draw(5, torch.Generator().manual_seed(0))
    assert len(set((drawn.flatten() * 255).round().tolist())) == 5
    assert len(pool.draw(20, torch.Generator().manual_seed(0))) == 8


def test_an_empty_pool_and_a_zero_capacity_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        SyntheticPool(0)
    with pytest.raises(ValueError, match="empty"):
        SyntheticPool(3).as_float()


def test_state_round_trip():
    pool = SyntheticPool(5)
    pool.add(torch.rand(3, 1, 2, 2))
    again = SyntheticPool.from_state(pool.state_dict())
    assert torch.equal(again.images, pool.images) and again.capacity == 5


def test_client_synthetic_batch_spreads_the_pool_over_an_average_clients_batches():
    """The README's CIFAR-100 run: 50000 images over 5 clients x 5 tasks x batch 128 -> ceil(15.6) = 16 batches;
    8000 / 16 = 500. With 10 tasks: ceil(7.8) = 8 batches, 1000."""
    assert client_synthetic_batch(8000, 50000, 5, 5, 128) == 500
    assert client_synthetic_batch(8000, 50000, 5, 10, 128) == 1000
    with pytest.raises(ValueError, match="no synthetic image"):
        client_synthetic_batch(3, 50000, 5, 10, 128)


def test_the_codes_zip_cuts_an_epoch_to_the_synthetic_batches():
    """2560 pooled images in batches of 500: 6 batches (the last of 60), so 16 real batches become 6 steps."""
    assert client_steps_per_epoch(16, 2560, 500) == 6
    assert client_steps_per_epoch(4, 2560, 500) == 4
