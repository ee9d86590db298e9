"""FedNCM (Legate et al., "Guiding the last layer in federated learning with pre-trained models", NeurIPS 2023):
each client sends its per-class sums and counts of frozen features; the server's classifier is the class means,
normalised (cosine nearest class mean: ``argmax_c <x, mu_c / |mu_c|>``, the paper's head) or, with ``metric:
euclidean``, the nearest mean in Euclidean distance (``w_c = mu_c``, ``b_c = -|mu_c|^2 / 2``). cfl's reading: the
statistics are sent once per client and task and summed over tasks (a continual stream: the classes seen so far),
and the head is the classifier itself (the paper's FedNCM+FT fine-tunes from it afterwards: not here)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.closed_form import ClosedFormHead
from cfl.tensors import State


@dataclass(frozen=True)
class FedNCMHyperparams:
    metric: str = field("cosine", "cosine (normalised class means, the paper's) or euclidean (nearest mean)",
                        choices=("cosine", "euclidean"))


class FedNCM(ClosedFormHead):
    name = "fedncm"
    about = ("FedNCM: class means of frozen features from the clients' per-class sums and counts (Legate et al. "
             "2023); a pretrained backbone's model")
    Hyperparams = FedNCMHyperparams

    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        return {"sums": onehot.T @ x, "counts": onehot.sum(0)}

    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        counts = server["counts"][slot]
        if not bool((counts > 0).any()):
            return None
        means = server["sums"][slot] / counts.clamp(min=1).unsqueeze(1)  # classes never seen: zero rows
        if self.hparams.metric == "cosine":
            return means / means.norm(dim=1, keepdim=True).clamp(min=1e-12), torch.zeros_like(counts)
        return means, -0.5 * (means * means).sum(1)
