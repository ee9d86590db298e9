"""TARGET's synthetic pool: the best image batch of each synthesis round, kept as 8-bit images.

The official code writes each batch as PNG files and reads them back (``ImagePool``, ``UnlabeledImageDataset``),
so the clients train on images quantised to ``floor(255 x) / 255`` (the code truncates, ``astype('uint8')``);
``quantize=False`` keeps the float images instead. The pool is unlabeled: the teacher labels it softly (KD).
It keeps the first ``capacity`` images added (the code's ``nums``, 8000 in the preset; our reading of its
"first files" rule, which orders file names as strings); the clients download all of it (:attr:`nbytes`).
"""

from __future__ import annotations

import math

import torch


class SyntheticPool:
    """Images in ``[0, 1]`` ``(N, C, H, W)``, stored as uint8 (``quantize``) or float32."""

    def __init__(self, capacity: int, quantize: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"the synthetic pool's capacity must be at least 1, got {capacity}")
        self.capacity, self.quantize = capacity, quantize
        self.images: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.images is None else len(self.images)

    def add(self, images: torch.Tensor) -> None:
        """Append a batch (clamped to ``[0, 1]``), as much of it as the capacity leaves room for."""
        room = self.capacity - len(self)
        batch = images.detach().clamp(0, 1)[:room]
        stored = (batch * 255).to(torch.uint8) if self.quantize else batch.float()
        self.images = stored if self.images is None else torch.cat([self.images, stored.to(self.images.device)])

    def as_float(self) -> torch.Tensor:
        """Every image as float in ``[0, 1]``."""
        if self.images is None:
            raise ValueError("the synthetic pool is empty: no synthesis round has run")
        return self.images.float() / 255 if self.quantize else self.images

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` images drawn without replacement (all of them if the pool holds fewer), as float."""
        images = self.as_float()
        order = torch.randperm(len(images), generator=generator, device=generator.device)[:n]
        return images[order.to(images.device)]

    @property
    def nbytes(self) -> int:
        """What shipping the pool costs."""
        return 0 if self.images is None else self.images.numel() * self.images.element_size()

    def state_dict(self) -> dict[str, object]:
        return {"capacity": self.capacity, "quantize": self.quantize, "images": self.images}

    @classmethod
    def from_state(cls, state: dict[str, object]) -> SyntheticPool:
        pool = cls(int(state["capacity"]), bool(state["quantize"]))  # type: ignore[arg-type]
        pool.images = state["images"]  # type: ignore[assignment]
        return pool


def client_synthetic_batch(pool_size: int, dataset_size: int, num_clients: int, num_tasks: int,
                           batch_size: int) -> int:
    """How many synthetic images go with each real batch on a client (the code's ``syn_bs``):
    ``floor(pool_size / ceil(dataset_size / (num_clients * num_tasks * batch_size)))``, i.e. the pool spread over
    the number of real batches an average client has per task. ``pool_size`` is the code's NOMINAL ``nums``
    (8000), whatever the pool holds (10 rounds of 256 make 2560 images)."""
    iters = math.ceil(dataset_size / (num_clients * num_tasks * batch_size))
    size = pool_size // iters
    if size < 1:
        raise ValueError(f"a pool of {pool_size} images spread over {iters} batches leaves no synthetic image per "
                         "batch; raise the pool size")
    return size


def client_steps_per_epoch(real_batches: int, pool_images: int, synthetic_batch: int) -> int:
    """Local steps per epoch in the code's ``zip(real loader, synthetic loader)``: it stops at the shorter, so a
    client with more real batches than the pool has synthetic batches sees only part of its data each epoch
    (README run: 16 real batches, 2560 pooled images in batches of 500 -> 6 steps)."""
    return min(real_batches, math.ceil(pool_images / synthetic_batch))
