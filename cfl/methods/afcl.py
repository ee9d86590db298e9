"""AFCL-style analytic federated continual learning (Tang et al., "AFCL: Analytic Federated Continual Learning for
Spatio-Temporal Invariance of Non-IID Data", 2025; analytic learning: Zhuang et al., ACIL, NeurIPS 2022): a ridge
regression on frozen features, solved in closed form. Each client sends, once per task, the Gram matrix
``X^T X`` and the cross-covariance ``X^T Y`` of its features (a column of ones appended: the bias) and one-hot
labels, in float64; the server sums them over clients and tasks and solves
``W = (sum X^T X + gamma I)^-1 sum X^T Y`` in float64. The result equals the centralised ridge regression on the
union of every client's data of the tasks seen (tests/pretrained/test_pretrained_methods.py checks it to 1e-8):
invariant to how the data is split among clients and to the order in which they arrive.

cfl's reading: the paper's random-projection buffer layer and its recursive (Woodbury) update are not used
(sums of Gram matrices give the same solution); gamma regularises the bias as well."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.closed_form import ClosedFormHead
from cfl.tensors import State


@dataclass(frozen=True)
class AFCLHyperparams:
    gamma: float = field(1.0, "ridge regularisation gamma of (X^T X + gamma I), at most 1e6 (WEIGHT_MAX: past it the "
                         "solution is the regulariser's, the features' statistics lost in its digits)", gt=0,
                         max=WEIGHT_MAX)


def with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_ones(len(x), 1)], dim=1)


def ridge(gram: torch.Tensor, cross: torch.Tensor, gamma: float) -> torch.Tensor:
    """``(gram + gamma I)^-1 cross`` in float64."""
    eye = torch.eye(len(gram), dtype=torch.float64, device=gram.device)
    return torch.linalg.solve(gram.to(torch.float64) + gamma * eye, cross.to(torch.float64))


class AFCL(ClosedFormHead):
    name = "afcl"
    about = ("AFCL: analytic learner, the server's float64 ridge regression on the clients' feature Gram and "
             "cross-covariance, sent once per task (Tang et al. 2025); a pretrained backbone's model")
    Hyperparams = AFCLHyperparams

    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        xb = with_bias(x)
        return {"gram": xb.T @ xb, "cross": xb.T @ onehot}

    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        gram = server["gram"][slot]
        if not bool(gram[-1, -1] > 0):  # the bias column's sum of ones: the samples seen
            return None
        w = ridge(gram, server["cross"][slot], self.hparams.gamma)  # (D + 1, K)
        return w[:-1].T, w[-1]
