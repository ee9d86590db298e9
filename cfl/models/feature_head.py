"""The trainable part of a run on a frozen backbone's cached features: one linear head (shared, or one per task)
on ``(N, D)`` feature vectors (linear probing; the classifier that fedncm and afcl set in closed form), optionally
behind a fixed random projection ``h = ReLU(x W)`` (RanPAC's, installed by the method: :meth:`FeatureHead.project`)."""

from __future__ import annotations

import torch
from torch import nn

from cfl.heads import make_head


class FeatureHead(nn.Module):
    """``head(features, task)``: the model the engine trains when the backbone's features are cached."""

    def __init__(self, features: int, classes: int, num_tasks: int, multi_head: bool) -> None:
        super().__init__()
        self.features = features
        self.classes, self.num_tasks, self.multi_head = classes, num_tasks, multi_head
        self.head = make_head(features, classes, num_tasks, multi_head)
        #: the fixed projection ``W (D, M)`` before the head, or None; a buffer (frozen, never sent or averaged),
        #: not persistent: its owner regenerates it (cfl/methods/ranpac.py: from the run's seed)
        self.register_buffer("projection", None, persistent=False)

    def project(self, weight: torch.Tensor) -> None:
        """Put the fixed projection ``h = ReLU(x W)`` (``weight``: ``W``, ``(D, M)``) before the head, which is
        made anew on ``M`` inputs with zero weights and biases (a closed-form head sets them), without drawing from
        the global random generator. A model takes one projection: the same matrix again is a no-op, another one
        is refused."""
        head = self.head.weight
        if weight.dim() != 2 or weight.shape[0] != self.features:
            raise ValueError(f"a projection of the {self.features}-wide features must be ({self.features}, M), "
                             f"got {tuple(weight.shape)}")
        weight = weight.to(device=head.device, dtype=head.dtype)
        if self.projection is not None:
            if self.projection.shape == weight.shape and torch.equal(self.projection, weight):
                return
            raise ValueError(f"the model's features are projected already, by another "
                             f"{tuple(self.projection.shape)} matrix; a model takes one projection")
        with torch.random.fork_rng(devices=[]):  # make_head's initialisation, overwritten just below
            new = make_head(weight.shape[1], self.classes, self.num_tasks, self.multi_head)
        new = new.to(device=head.device, dtype=head.dtype)
        with torch.no_grad():
            for p in new.parameters():
                p.zero_()
        self.head, self.projection = new, weight

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        if self.projection is not None:
            x = torch.relu(x @ self.projection)
        return self.head(x, task)
