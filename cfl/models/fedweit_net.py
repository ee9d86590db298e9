"""FedWeIT's networks (Yoon et al., ICML 2021): every linear and conv weight decomposed as
``B * sigmoid(mask^(t)) + A^(t) + kb_mix^(t) + sum_k attention^(t)_k kb_k`` (:mod:`cfl.models.fedweit_weight`),
one head per task (task-incremental only).

Each decomposed layer holds, as parameters (so a stack of clients carries them per client):
``base`` ``(out, ...)`` (shared, the part the server averages), per task ``mask`` logits ``(T, out)``,
``adaptive`` ``(T, out, ...)``, ``bias`` ``(T, out)`` and ``attention`` ``(T, K)``; the knowledge base ``kb``
``(K, out, ...)`` of the current task (clients' task-adaptive parts from the server), and ``kb_mix``
``(T, out, ...)``: for a finished task, its attention-weighted knowledge base folded into one tensor
(:func:`cfl.models.fedweit_weight.fold_knowledge`), so a past task keeps its weight after ``kb`` is replaced, without
storing every task's knowledge base (the official code keeps one per task; the composed weights are the same).
Both enter the forward detached, so no gradient reaches them (an optimiser's weight decay still would:
:data:`FROZEN`).

A batch may mix tasks: the weight of every task present in the batch is composed and each sample takes its own
task's output (as :class:`cfl.heads.MultiHead`), at a plain layer's cost times the number of tasks present
(one in local training: FedWeIT replays nothing). In eval mode ``A`` is pruned at
``|A| > prune`` (the official code's evaluation, ``modules/layers.py``: its L1 weight 1e-3) and the gated mask at
``> prune_mask`` (0 there).

Initialisation (cfl's reading of ``modules/nets.py``): the base as torch's own ``nn.Linear``/``nn.Conv2d``
weight (the code: a fan-in truncated normal), every task's ``A`` = base / 3 (the code's ``adaptive_factor``),
mask logits, biases and attention from a truncated normal with std ``1/sqrt(size)``, task 0's attention 0 (the
first task has no knowledge base), ``kb`` and ``kb_mix`` 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cfl.heads import MultiHead
from cfl.models.fedweit_weight import decomposed_weight, gate, hard_threshold, knowledge_sum

#: parameter names of a decomposed layer that the server averages; every other one stays with its client
SHARED = ("base",)
#: parameters that no optimiser step may move (filled by the method: the knowledge base and its folded sums)
FROZEN = ("kb", "kb_mix")
#: the official code's L1 weight, which its evaluation also prunes ``A`` at
PRUNE = 1e-3


def _small(*shape: int) -> torch.Tensor:
    std = 1.0 / max(shape[-1], 1) ** 0.5
    return nn.init.trunc_normal_(torch.empty(*shape), std=std, a=-2 * std, b=2 * std)


class Decomposed(nn.Module):
    """The parameters and composed weights of one decomposed layer; ``weight_like`` a plain layer's weight
    ``(out, ...)`` whose values become the base."""

    def __init__(self, weight_like: torch.Tensor, num_tasks: int, kb_size: int, prune: float = PRUNE,
                 prune_mask: float = 0.0) -> None:
        super().__init__()
        out = weight_like.shape[0]
        base = weight_like.detach().clone()
        self.base = nn.Parameter(base)
        self.mask = nn.Parameter(_small(num_tasks, out))
        self.adaptive = nn.Parameter(base.unsqueeze(0).repeat(num_tasks, *([1] * base.dim())) / 3)
        self.bias = nn.Parameter(_small(num_tasks, out))
        attention = _small(num_tasks, kb_size)
        attention[0] = 0
        self.attention = nn.Parameter(attention)
        self.kb = nn.Parameter(torch.zeros(kb_size, *base.shape))
        self.kb_mix = nn.Parameter(torch.zeros(num_tasks, *base.shape))
        self.prune, self.prune_mask = prune, prune_mask

    def weights(self, tasks: torch.Tensor | None = None) -> torch.Tensor:
        """``(T, out, ...)``: every task's composed weight, or ``(len(tasks), out, ...)``: those of the task ids
        ``tasks`` (pruned as the code evaluates, in eval mode)."""
        mask, adaptive, kb_mix, attention = self.mask, self.adaptive, self.kb_mix, self.attention
        if tasks is not None:
            mask, adaptive, kb_mix, attention = mask[tasks], adaptive[tasks], kb_mix[tasks], attention[tasks]
        mask = gate(mask)
        if not self.training:
            mask, adaptive = hard_threshold(mask, self.prune_mask), hard_threshold(adaptive, self.prune)
        # the knowledge base and its folded sums enter detached: no gradient ever reaches them
        return (decomposed_weight(self.base, mask, adaptive) + kb_mix.detach()
                + knowledge_sum(self.kb.detach(), attention))


def _own_task(every: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``every`` ``(B, n, ...)``, each sample's outputs under the ``n`` tasks present: sample ``b``'s under its own,
    ``where[b]`` (its index among them)."""
    index = where.view(-1, *([1] * (every.dim() - 1))).expand(-1, 1, *every.shape[2:])
    return every.gather(1, index).squeeze(1)


class DecomposedLinear(Decomposed):
    def __init__(self, in_features: int, out_features: int, num_tasks: int, kb_size: int, **prune: float) -> None:
        super().__init__(nn.Linear(in_features, out_features).weight, num_tasks, kb_size, **prune)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        present, where = task.unique(return_inverse=True)
        every = torch.einsum("bi,toi->bto", x, self.weights(present)) + self.bias[present]  # (B, n, out)
        return _own_task(every, where)


class DecomposedConv2d(Decomposed):
    def __init__(self, in_channels: int, out_channels: int, kernel: int, num_tasks: int, kb_size: int,
                 padding: int = 0, **prune: float) -> None:
        super().__init__(nn.Conv2d(in_channels, out_channels, kernel).weight, num_tasks, kb_size, **prune)
        self.padding = padding

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        present, where = task.unique(return_inverse=True)
        theta = self.weights(present)  # (n, out, in, kh, kw)
        tasks, out = theta.shape[:2]
        every = F.conv2d(x, theta.flatten(0, 1), self.bias[present].flatten(), padding=self.padding)
        return _own_task(every.view(len(x), tasks, out, *every.shape[-2:]), where)


class ChannelLRN(nn.Module):
    """Local response normalisation across channels, ``x / (k + alpha / size * sum of x^2 over the size channels
    centred on each)^beta`` (``nn.LocalResponseNorm``'s formula and window), the window sums taken as differences of
    a cumulative sum over the channels: ``nn.LocalResponseNorm`` runs a 3-d average pooling, which took 38 % of a
    FedWeIT LeNet training step on the CPU."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square = F.pad(x * x, (0, 0, 0, 0, self.size // 2 + 1, (self.size - 1) // 2))  # one leading zero channel
        running = square.cumsum(1)
        window = running[:, self.size:] - running[:, : -self.size]  # (B, C, H, W): the size channels around each
        return x / (self.k + self.alpha / self.size * window).pow(self.beta)


class TaskSequential(nn.Module):
    """Layers applied in turn, the decomposed ones also given each sample's task, then one head per task."""

    def __init__(self, layers: list[nn.Module], features: int, classes: int, num_tasks: int) -> None:
        super().__init__()
        self.body = nn.ModuleList(layers)
        self.head = MultiHead(features, classes, num_tasks)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        for layer in self.body:
            x = layer(x, task) if isinstance(layer, Decomposed) else layer(x)
        return self.head(x, task)

    def decomposed(self) -> dict[str, Decomposed]:
        """``{parameter prefix: layer}`` of the decomposed layers, in order."""
        return {name: m for name, m in self.named_modules() if isinstance(m, Decomposed)}


def _task_incremental(multi_head: bool) -> None:
    if not multi_head:
        raise ValueError("FedWeIT's networks keep one head per task: they need a task-incremental stream "
                         "(scenario: task)")


class FedWeITMLP(TaskSequential):
    """Flatten, then decomposed linear layers of widths ``hidden`` with ReLU, then one head per task."""

    def __init__(self, in_features: int, hidden: list[int], classes: int, num_tasks: int, kb_size: int,
                 multi_head: bool = True, **prune: float) -> None:
        _task_incremental(multi_head)
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [DecomposedLinear(width, size, num_tasks, kb_size, **prune), nn.ReLU()]
            width = size
        super().__init__(layers, width, classes, num_tasks)


class FedWeITLeNet(TaskSequential):
    """The official code's LeNet (``modules/nets.py``): conv 5x5 20 and 50 channels ('same' padding), each with
    ReLU, local response normalisation (TensorFlow's ``lrn(x, 4, bias=1, alpha=0.001/9, beta=0.75)``, a window of
    9 channels) and 3x3 max-pooling at stride 2; fc 800 and 500 with ReLU; one head per task. TensorFlow pads the
    'same' pooling on the bottom/right only, torch here on both sides (cfl's reading)."""

    def __init__(self, in_channels: int, image_size: int, classes: int, num_tasks: int, kb_size: int,
                 multi_head: bool = True, **prune: float) -> None:
        _task_incremental(multi_head)
        layers: list[nn.Module] = []
        width, size = in_channels, image_size
        for channels in (20, 50):
            layers += [DecomposedConv2d(width, channels, 5, num_tasks, kb_size, padding=2, **prune), nn.ReLU(),
                       ChannelLRN(9, alpha=0.001, beta=0.75, k=1.0), nn.MaxPool2d(3, 2, padding=1)]
            width, size = channels, (size - 1) // 2 + 1
        layers.append(nn.Flatten())
        width = width * size * size
        for units in (800, 500):
            layers += [DecomposedLinear(width, units, num_tasks, kb_size, **prune), nn.ReLU()]
            width = units
        super().__init__(layers, width, classes, num_tasks)

