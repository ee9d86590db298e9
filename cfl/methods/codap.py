"""CODA-Prompt (Smith et al., CVPR 2023, "CODA-Prompt: COntinual Decomposed Attention-based Prompting for
Rehearsal-Free Continual Learning"; official code github.com/GT-RIPL/CODA-Prompt, models/zoo.py), federated by
FedAvg over the prompt components, their keys, their attention vectors and the head. The model
(``model.train: components``, cfl/pretrained/coda_prompt.py and adapted.py) weights each of ``prompt_pool``
components by ``cos(query * A_m, K_m)`` of the frozen backbone's [CLS] feature (the query), prepends their
weighted sum (``prompt_length`` tokens) after [CLS] and classifies the [CLS] output. This file is one client's loss
beyond the cross-entropy: the orthogonality penalty ``ortho * (mean((K K^T - I)^2) + mean((A A^T - I)^2) +
mean((P P^T - I)^2))`` (the paper's Eq. 7, the code's ``ortho_penalty`` times ``ortho_mu``).

Which ``ortho_penalty``: the repository's two versions differ. Its beta release (commit 22948d2, April 2023)
multiplies the mean by 1e-6 (and its scripts ran ``ortho_mu`` 0.1: a weight of 1e-7); the current code (605ac87,
June 2023, "online ortho init") drops the factor and re-initialises each task's components by Gram-Schmidt, so its
scripts set ``ortho_mu`` 0.0. cfl follows the current form (``ortho_form: current``, the default): cfl trains
every component at every task with no Gram-Schmidt re-initialisation, so the penalty is what keeps the components
apart and must act at the weight it is given (with the 1e-6 factor, 0.1 would leave it all but off).
``ortho_form: beta`` is the beta release's penalty, times 1e-6.

cfl's reading (differences from the official code): the prompt is prepended to the input tokens (prompt tuning,
as cfl's L2P), where CODA-P prefixes keys and values of layers 0-4 (prefix tuning); every component trains at
every task, where the code gives each task its own ``pool / tasks`` components, freezes earlier ones and
re-initialises the new ones by Gram-Schmidt (so its current scripts set the penalty to 0.0: ``--prompt_param
100 8 0.0``); cfl's default ``ortho`` 0.1 keeps the penalty active instead. Components, keys and attention start
with orthonormal rows (the code's Gram-Schmidt start). The cross-entropy's softmax runs over the current task's
classes only (``class_mask: current``, the code's ``logits[:, :last_valid_out_dim] = -inf``); ``seen``: every class
seen so far."""

from __future__ import annotations

from dataclasses import dataclass

from cfl.config.schema import field
from cfl.methods.base import Computes, LossContext, LossTerms, Method, Requires
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.pretrained.coda_prompt import orthogonality

#: the factor inside the beta release's ``ortho_penalty`` (GT-RIPL/CODA-Prompt 22948d2, models/zoo.py)
BETA_FACTOR = 1e-6


@dataclass(frozen=True)
class CodaPHyperparams:
    ortho: float = field(0.1, "weight of the orthogonality penalty on components, keys and attention vectors "
                              "(the official code's ortho_mu)", min=0, max=WEIGHT_MAX)
    ortho_form: str = field("current", "the official ortho_penalty's version: current (commit 605ac87, the mean of "
                                       "squares) or beta (22948d2, that times 1e-6)", choices=("current", "beta"))
    class_mask: str = class_mask_field("current")


class CodaP(ClassMasked, Method):
    name = "codap"
    about = ("CODA-Prompt: attention-weighted prompt components on a frozen pretrained ViT (Smith et al. 2023), "
             "FedAvg of components, keys, attention vectors and head; model.train: components")
    Hyperparams = CodaPHyperparams
    requires = Requires(model_train="components")
    computes = Computes(losses=("task", "extra"))

    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return super().loss(ctx)
        penalty = sum(orthogonality(ctx.params[f"prompt.{k}"]) for k in ("keys", "attention", "prompts"))
        if self.hparams.ortho_form == "beta":
            penalty = penalty * BETA_FACTOR
        return LossTerms(extra=self.hparams.ortho * penalty * ctx.x.new_ones(ctx.x.shape[0]))
