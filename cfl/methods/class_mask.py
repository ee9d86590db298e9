"""``method.class_mask`` of the pretrained-backbone methods: which classes the class-incremental cross-entropy's
softmax runs over. ``current``: the sample's own task's classes (the official code of L2P, the PyTorch port's
``train_mask``; CODA-P and Fed-CPrompt, ``logits[:, :last_valid_out_dim] = -inf``; LoRM in fed-mammoth,
``outputs[:, cur_offset:cur_offset + cpt]``): the old classes' logits get no push down from the new task's data.
``seen``: every class seen so far (cfl's ``loss: ce`` for every other method). Under the task- and
domain-incremental scenarios the two are one (a task's head, or every task's classes, are the sample's task's)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch

from cfl.config.schema import field
from cfl.methods.declarations import Computes
from cfl.methods.training_hooks import LossContext, LossTerms
from cfl.ops.losses import CLASS_MASKS, current_task_cross_entropy, masked_cross_entropy, task_class_table


def class_mask_field(default: str = "current") -> Any:
    """The ``class_mask`` hyperparameter, ``default`` the method's official code's."""
    return field(default, "classes the class-incremental cross-entropy's softmax runs over: current (the sample's "
                          "task's classes, the official code's) or seen (every class seen so far)",
                 choices=CLASS_MASKS)


class ClassMasked:
    """Mixin (before ``Method``) whose loss's task part is the cross-entropy under ``hparams.class_mask``."""

    run_info: Any
    hparams: Any
    computes: ClassVar[Computes] = Computes(losses=("task",))

    def loss(self, ctx: LossContext) -> LossTerms:
        """Per sample, the cross-entropy over the sample's task's classes (``current``) or the seen ones."""
        classes, z, y = self.run_info.task_classes, ctx.logits, ctx.y
        if self.hparams.class_mask == "seen" or self.run_info.scenario != "class":
            return LossTerms(task=masked_cross_entropy(z, y, ctx.allowed))
        return LossTerms(task=current_task_cross_entropy(z, y, ctx.task, ctx.weight, _table(classes, z.shape[-1])))


@functools.cache
def _table(task_classes: tuple[tuple[int, ...], ...], num_classes: int) -> torch.Tensor:
    return task_class_table(task_classes, num_classes)
