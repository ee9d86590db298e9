"""CODA-Prompt (Smith et al., CVPR 2023, "CODA-Prompt: COntinual Decomposed Attention-based Prompting for
Rehearsal-Free Continual Learning"; official code github.com/GT-RIPL/CODA-Prompt, models/zoo.py), federated by
FedAvg over the prompt components, their keys, their attention vectors and the head. The model
(``model.train: components``, cfl/pretrained/coda_prompt.py and adapted.py) weights each of ``prompt_pool``
components by ``cos(query * A_m, K_m)`` of the frozen backbone's [CLS] feature (the query), prepends their
weighted sum (``prompt_length`` tokens) after [CLS] and classifies the [CLS] output. This file is one client's loss
beyond the cross-entropy: the orthogonality penalty ``ortho * (mean((K K^T - I)^2) + mean((A A^T - I)^2) +
mean((P P^T - I)^2))`` (the paper's Eq. 7, the code's ``ortho_penalty`` times ``ortho_mu``).

cfl's reading (differences from the official code): the prompt is prepended to the input tokens (prompt tuning,
as cfl's L2P), where CODA-P prefixes keys and values of layers 0-4 (prefix tuning); every component trains at
every task, where the code gives each task its own ``pool / tasks`` components, freezes earlier ones and
re-initialises the new ones by Gram-Schmidt (so its current scripts set the penalty to 0.0: ``--prompt_param
100 8 0.0``); cfl's default ``ortho`` 0.1 keeps the penalty active instead. Components, keys and attention start
with orthonormal rows (the code's Gram-Schmidt start)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cfl.methods.base import Method, Params, State
from cfl.methods.bounds import WEIGHT_MAX
from cfl.pretrained.coda_prompt import orthogonality
from cfl.schema import field


@dataclass(frozen=True)
class CodaPHyperparams:
    ortho: float = field(0.1, "weight of the orthogonality penalty on components, keys and attention vectors "
                              "(the official code's ortho_mu)", min=0, max=WEIGHT_MAX)


class CodaP(Method):
    name = "codap"
    about = ("CODA-Prompt: attention-weighted prompt components on a frozen pretrained ViT (Smith et al. 2023), "
             "FedAvg of components, keys, attention vectors and head; model.train: components")
    Hyperparams = CodaPHyperparams
    backbone_only: ClassVar[bool] = True
    model_train: ClassVar[str] = "components"

    def extra_loss(self, params: Params, x: torch.Tensor, task: torch.Tensor, server: State,
                   state: State) -> torch.Tensor:
        penalty = sum(orthogonality(params[f"prompt.{k}"]) for k in ("keys", "attention", "prompts"))
        return self.hparams.ortho * penalty * torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
