"""LoRA factors of an attention ``qkv`` projection, per task and per output part (``model.lora_tasks: per-task``,
``model.lora_targets: qv``): PILoRA's incremental LoRA (Guo et al. 2024, "PILoRA: Prototype Guided Incremental LoRA
for Federated Class-Incremental Learning", Sec. 3.2; official code github.com/Ghy0501/PILoRA, ``VLT.py``
``_LoRA_qkv_timm``, and fed-mammoth's ``_models/pilora.py``): each task ``t`` has its own pair ``A_t`` ``(r, in)``,
``B_t`` ``(d, r)`` for each adapted part (the query and the value: ``qkv[..., :d] += B_q A_q x`` and
``qkv[..., 2d:] += B_v A_v x``, the official lines), ``A`` Kaiming-uniform and ``B`` zero at the start (the official
``init``), and the output adds every task's update, ``W x + (alpha / r) sum_t B_t A_t x`` (the paper's merged model,
fed-mammoth's forward: the tasks before the current one and the current one). A later task's ``B`` is zero until it
trains, so its pair adds nothing; a method trains the current task's pair only (PILoRA's ``step_gradient``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

#: the parts of the ``(3 d)`` qkv output each ``model.lora_targets`` adapts, as ``(start, stop)`` in units of ``d``
TARGETS = {"qkv": ((0, 3),), "qv": ((0, 1), (2, 3))}


class TaskLoRALinear(nn.Module):
    """``base`` (frozen: weight and bias held as buffers) plus ``lora_a`` ``(tasks, parts, r, in)`` and ``lora_b``
    ``(tasks, parts, out_part, r)``, one pair per task and adapted output part."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, tasks: int, targets: str) -> None:
        super().__init__()
        self.register_buffer("weight", base.weight.detach(), persistent=False)
        self.register_buffer("bias", None if base.bias is None else base.bias.detach(), persistent=False)
        self.scale = alpha / rank
        unit = base.out_features // 3
        self.parts = tuple((start * unit, stop * unit) for start, stop in TARGETS[targets])
        width = self.parts[0][1] - self.parts[0][0]
        a = torch.empty(tasks, len(self.parts), rank, base.in_features)
        for t in range(tasks):
            for j in range(len(self.parts)):
                nn.init.kaiming_uniform_(a[t, j], a=math.sqrt(5))  # nn.Linear's, as the official A
        self.lora_a = nn.Parameter(a)
        self.lora_b = nn.Parameter(torch.zeros(tasks, len(self.parts), width, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        updates = []
        for j in range(len(self.parts)):
            a = self.lora_a[:, j].reshape(-1, self.lora_a.shape[-1])  # every task's A, stacked: (tasks r, in)
            b = self.lora_b[:, j].permute(1, 0, 2).reshape(self.lora_b.shape[2], -1)  # (out_part, tasks r)
            updates.append(self.scale * F.linear(F.linear(x, a), b))  # sum_t B_t A_t x
        pieces, at = [], 0
        for (start, stop), update in zip(self.parts, updates, strict=True):
            pieces += [out[..., at:start], out[..., start:stop] + update]
            at = stop
        pieces.append(out[..., at:])
        return torch.cat(pieces, -1)

    def merged(self) -> torch.Tensor:
        """The one weight matrix this layer applies: ``W`` plus ``(alpha / r) sum_t B_t A_t`` in each part."""
        weight = self.weight.clone()
        for j, (start, stop) in enumerate(self.parts):
            weight[start:stop] += self.scale * torch.einsum("tor,tri->oi", self.lora_b[:, j], self.lora_a[:, j])
        return weight
