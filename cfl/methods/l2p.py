"""L2P (Wang et al., CVPR 2022, "Learning to Prompt for Continual Learning"), federated by FedAvg over the prompts,
their keys and the head (the FedAvg+L2P baseline of the federated prompt papers, e.g. Fed-CPrompt, Bagwe et al.
2023; Powder, Piao et al. ICML 2024). The model (``model.train: prompts``, cfl/pretrained/adapted.py and
prompt_pool.py) selects for each input the ``prompt_top_k`` prompts whose keys are most cosine-similar to the frozen
backbone's [CLS] feature of the input (the query), prepends them after [CLS] and classifies the average of their
outputs. This file is one client's loss beyond the cross-entropy: L2P's surrogate loss pulling the selected keys
towards the query, ``lam * sum_k (1 - cos(query, key_k))`` (the paper's Eq. 5; the official code's
``pull_constraint_coeff``, 0.1 in github.com/JH-LEE-KR/l2p-pytorch, which subtracts ``lam * sum_k cos``: the same
gradient).

cfl's reading: selection is per input at training and evaluation (the port's ``batchwise_prompt``, a majority vote
over a test batch, is not used: a sample's prediction never depends on its batch); no prompt-frequency penalty
(the paper's optional diversity term); the prompts are prepended after the position embeddings, without positions
of their own. The cross-entropy's softmax runs over the current task's classes only (``class_mask: current``, the
port's ``train_mask``, default True: the other classes' logits set to ``-inf``); ``class_mask: seen`` runs it over
every class seen so far, as cfl's ``loss: ce`` for the non-prompt methods. The query
is a forward of the frozen backbone without prompts: computed once per sample when the run starts and read from
each input row by the forward and by this loss (cfl/pretrained/queries.py), where the official code runs it at every
step."""

from __future__ import annotations

from dataclasses import dataclass

from cfl.config.schema import field
from cfl.methods.base import Computes, LossContext, LossTerms, Method, Requires
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.pretrained.prompt_pool import key_distance


@dataclass(frozen=True)
class L2PHyperparams:
    lam: float = field(0.1, "weight of the surrogate key-query loss (the official code's pull_constraint_coeff)",
                       min=0, max=WEIGHT_MAX)
    class_mask: str = class_mask_field("current")


class L2P(ClassMasked, Method):
    name = "l2p"
    about = ("L2P: a prompt pool with key-query selection on a frozen pretrained ViT (Wang et al. 2022), FedAvg of "
             "prompts, keys and head; model.train: prompts")
    Hyperparams = L2PHyperparams
    requires = Requires(model_train="prompts")
    computes = Computes(losses=("task", "extra"))

    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return super().loss(ctx)
        query, prompt = self.run_info.model.query(ctx.x), self.run_info.model.prompt
        return LossTerms(extra=self.hparams.lam * key_distance(query, ctx.params["prompt.keys"], prompt.top_k))
