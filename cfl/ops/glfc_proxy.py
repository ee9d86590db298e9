"""GLFC's proxy server and the client side of it (Dong et al., CVPR 2022; the official code ``conditionWang/FCIL``,
``src/GLFC.py`` and ``src/ProxyServer.py``), as small functions.

Client: per new class, the real sample nearest the class's mean feature (:func:`prototype_index`) is perturbed by a
few SGD steps on the input (:func:`perturb`) to lower the local model's loss for its class, and the gradient of the
cross-entropy of a fixed random LeNet at it is uploaded (:func:`encoder_gradient`). Server: the label of each
gradient from its last layer (:func:`infer_label`, iDLG), an input whose gradient matches it by L-BFGS from N(0, 1)
(:func:`reconstruct`, DLG), the last iterates kept as samples; each new global model scored on them
(:func:`accuracy`) and the best kept (:func:`keep_best`), the best of a finished task becoming the old model of the
relation distillation (:func:`finish_task`). Task detection by the rise of the prediction entropy
(:func:`mean_entropy`, :func:`new_task_signal`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cfl.ops.batched_lbfgs import Evaluate, lbfgs_iterates
from cfl.ops.glfc_memory import herding
from cfl.tensors import Params

#: the official code's prediction-entropy rise (nats) that flags new classes on a client
ENTROPY_RISE = 1.2
#: the official code's epsilon inside the entropy's log
_ENTROPY_EPS = 1e-5


def prototype_index(features: torch.Tensor) -> int:
    """The sample whose L2-normalised feature is nearest the class mean of them: herding's first choice."""
    return int(herding(features, 1)[0])


def prototype_loss(logits: torch.Tensor, label: int, seen: torch.Tensor) -> torch.Tensor:
    """The loss the perturbation lowers (official code): the mean over the seen classes' columns of
    ``BCE(z_c, onehot(label)_c)``; ``logits`` (1, K) or (K,), ``seen`` (K,) bool."""
    z = logits.reshape(-1)[seen]
    target = (torch.arange(len(logits.reshape(-1)), device=z.device) == label)[seen].to(z.dtype)
    return F.binary_cross_entropy_with_logits(z, target)


def perturb(x: torch.Tensor, loss_fn: Callable[[torch.Tensor], torch.Tensor], steps: int = 50, lr: float = 0.01,
            weight_decay: float = 1e-5) -> torch.Tensor:
    """``x`` after ``steps`` of ``torch.optim.SGD(lr, weight_decay)`` on the input, minimising ``loss_fn(x)``
    (official code: 50 steps, the local lr / 10, weight decay 1e-5); ``x`` itself is left unchanged."""
    moved = x.detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([moved], lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(moved).backward()
        opt.step()
    return moved.detach()


def _encoder_grads(encoder: nn.Module, x: torch.Tensor, label: torch.Tensor, create_graph: bool) -> list[torch.Tensor]:
    loss = F.cross_entropy(encoder(x), label)
    return list(torch.autograd.grad(loss, list(encoder.parameters()), create_graph=create_graph))


def encoder_gradient(encoder: nn.Module, x: torch.Tensor, label: int) -> list[torch.Tensor]:
    """The gradient (one tensor per parameter, in order) of the encoder's cross-entropy at one sample ``x`` (the
    sample's shape, no batch dim) with its ``label``: what a GLFC client uploads per new class."""
    y = torch.tensor([label], device=x.device)
    return [g.detach() for g in _encoder_grads(encoder, x.detach().unsqueeze(0), y, create_graph=False)]


def infer_label(last_weight_grad: torch.Tensor) -> int:
    """The label of a one-sample cross-entropy gradient from its last linear layer's weight gradient ``(K, H)``:
    the row with the smallest sum (iDLG, Zhao et al. 2020). Row c is ``(p_c - onehot_c) h``; after a sigmoid the
    features ``h`` are positive, so only the label's row sums below zero."""
    return int(torch.argmin(last_weight_grad.sum(-1)))


def gradient_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum over tensors of || a_k - b_k ||^2`` (DLG's matching loss)."""
    return sum(((ga - gb) ** 2).sum() for ga, gb in zip(a, b, strict=True))  # type: ignore[return-value]


@dataclass
class Reconstruction:
    samples: torch.Tensor  # (keep, *input shape): the last ``keep`` iterates, oldest first
    label: int
    start_distance: float  # gradient distance at the N(0, 1) start
    final_distance: float  # at the last iterate


def reconstruct(encoder: nn.Module, target: Sequence[torch.Tensor], input_shape: tuple[int, ...],
                generator: torch.Generator, steps: int = 250, lr: float = 0.1, keep: int = 20,
                label: int | None = None) -> Reconstruction:
    """An input whose encoder gradient matches ``target`` (DLG with the iDLG label): from ``x ~ N(0, 1)`` drawn
    from ``generator``, ``steps`` calls of ``torch.optim.LBFGS(lr)``'s step (its default 20 inner iterations each)
    on :func:`gradient_distance`; the iterates after the last ``keep`` calls are the samples (official code: 250
    steps, lr 0.1, 20 kept). ``label``: None infers it from ``target[-2]``, the last layer's weight gradient."""
    return reconstruct_all(encoder, [target], input_shape, generator, steps, lr, keep,
                           None if label is None else [label])[0]


def _matching(encoder: nn.Module, targets: Sequence[Sequence[torch.Tensor]], labels: torch.Tensor,
              input_shape: tuple[int, ...]) -> Evaluate:
    """``evaluate(x, rows)`` for :func:`lbfgs_iterates`: per row, :func:`gradient_distance` between the encoder's
    gradient at ``x[i]`` (flat) with label ``labels[rows[i]]`` and ``targets[rows[i]]``, and its gradient in
    ``x[i]``: one ``vmap`` over the rows (the encoder's parameters get no gradient)."""
    names = [name for name, _ in encoder.named_parameters()]
    params = {name: p.detach() for name, p in encoder.named_parameters()}
    stacked = {name: torch.stack([t[k] for t in targets]) for k, name in enumerate(names)}

    def cross_entropy(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(encoder, p, (x.reshape(1, *input_shape),)), y.unsqueeze(0))

    def distance(x: torch.Tensor, y: torch.Tensor, target: dict[str, torch.Tensor]) -> torch.Tensor:
        g = torch.func.grad(cross_entropy)(params, x, y)
        return sum(((g[n] - target[n]) ** 2).sum() for n in names)  # type: ignore[return-value]

    batched = torch.func.vmap(torch.func.grad_and_value(distance))

    def evaluate(x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, value = batched(x, labels[rows], {n: t[rows] for n, t in stacked.items()})
        return value, grad

    return evaluate


def reconstruct_all(encoder: nn.Module, targets: Sequence[Sequence[torch.Tensor]], input_shape: tuple[int, ...],
                    generator: torch.Generator, steps: int = 250, lr: float = 0.1, keep: int = 20,
                    labels: Sequence[int] | None = None, iterations: int = 20) -> list[Reconstruction]:
    """:func:`reconstruct` of every gradient of ``targets`` (the starts drawn from ``generator`` in their order),
    all at once: each its own L-BFGS (:func:`cfl.ops.batched_lbfgs.lbfgs_iterates`), one batched gradient-matching
    evaluation per iteration for all of them; ``iterations``: L-BFGS iterations per step (torch's ``max_iter``)."""
    if not 1 <= keep <= steps:
        raise ValueError(f"reconstruct: keep={keep} iterates of steps={steps}; need 1 <= keep <= steps")
    labels = [infer_label(t[-2]) for t in targets] if labels is None else list(labels)
    dtype, device = targets[0][0].dtype, targets[0][0].device
    x0 = torch.stack([torch.randn((1, *input_shape), generator=generator, dtype=dtype) for _ in targets]).to(device)
    x0 = x0.flatten(1)
    evaluate = _matching(encoder, targets, torch.tensor(labels, device=device), input_shape)
    everyone = torch.arange(len(targets), device=device)
    with torch.no_grad():
        start, _ = evaluate(x0, everyone)
        kept = lbfgs_iterates(x0, evaluate, steps, lr, keep, max_iter=iterations)
        final, _ = evaluate(kept[:, -1], everyone)
    return [Reconstruction(kept[i].reshape(keep, *input_shape), labels[i], float(start[i]), float(final[i]))
            for i in range(len(targets))]


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Share of argmax predictions equal to ``y`` (the proxy's score of a global model on the reconstructions)."""
    return float((logits.argmax(-1) == y).to(torch.float64).mean())


@dataclass
class BestModel:
    """The proxy server's best global model of the running task and its score on the reconstructions."""

    score: float = -math.inf
    params: Params | None = None


def keep_best(best: BestModel, score: float, params: Params) -> BestModel:
    """The new global model replaces the best when it scores at least as well (official code: ``>=``)."""
    return BestModel(score, params) if score >= best.score else best


def finish_task(best: BestModel, keep_score: bool = False) -> tuple[Params | None, BestModel]:
    """At a task switch: the best model of the finished task (the old model of the relation distillation) and the
    best to carry on with. Its score restarts at -inf, so the first model of the new task is kept; ``keep_score``:
    the official code's quirk (off by default), which never resets it, so a new-task model must beat the old task's
    best score, measured on other reconstructions."""
    return best.params, BestModel(best.score if keep_score else -math.inf, best.params)


def mean_entropy(logits: torch.Tensor, seen: torch.Tensor) -> float:
    """Mean over the samples of the entropy (nats) of the softmax over the seen classes (official code:
    ``-sum p log(p + 1e-5)``)."""
    p = F.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1)
    return float((-(p * torch.log(p + _ENTROPY_EPS)).sum(-1)).mean())


def new_task_signal(entropy: float, last_entropy: float, threshold: float = ENTROPY_RISE) -> bool:
    """Whether a client flags new classes: its mean prediction entropy rose by more than ``threshold`` nats since
    its last check (the official code compares with the previous check's value, starting from 0)."""
    return entropy - last_entropy > threshold


def prototype_gradients(logits_fn: Callable[[torch.Tensor], torch.Tensor], features: torch.Tensor, x: torch.Tensor,
                        y: torch.Tensor, classes: Sequence[int], encoder: nn.Module, seen: torch.Tensor,
                        steps: int = 50, lr: float = 0.01, weight_decay: float = 1e-5,
                        encoder_labels: Sequence[int] | None = None) -> list[list[torch.Tensor]]:
    """A client's upload for its new ``classes``: per class, its prototype (:func:`prototype_index` on the class's
    ``features``, rows of ``x``), perturbed by :func:`perturb` to lower :func:`prototype_loss` of
    ``logits_fn`` (a batch of inputs -> logits: the client's trained model, in eval mode), then the encoder's
    gradient at it (:func:`encoder_gradient`) with the class's ``encoder_labels`` entry (None: the class itself;
    task- and domain-incremental streams encode global class ids)."""
    out = []
    for c, label in zip(classes, classes if encoder_labels is None else encoder_labels, strict=True):
        rows = torch.nonzero(y == c).flatten()
        if len(rows) == 0:
            raise ValueError(f"prototype_gradients: class {c} has no sample on this client")
        proto = x[rows[prototype_index(features[rows])]]
        moved = perturb(proto, lambda v, c=c: prototype_loss(logits_fn(v.unsqueeze(0)), c, seen), steps, lr,
                        weight_decay)
        out.append(encoder_gradient(encoder, moved, label))
    return out


def monitor_set(encoder: nn.Module, gradients: Sequence[Sequence[torch.Tensor]], input_shape: tuple[int, ...],
                generator: torch.Generator, steps: int = 250, lr: float = 0.1, keep: int = 20,
                iterations: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """The proxy server's monitor set from the uploaded gradients: each one's :func:`reconstruct` samples with its
    inferred label, all together: ``x (len(gradients) * keep, *input_shape)``, ``y``."""
    if not gradients:
        raise ValueError("monitor_set: no gradient was uploaded")
    recs = reconstruct_all(encoder, gradients, input_shape, generator, steps, lr, keep, iterations=iterations)
    x = torch.cat([r.samples for r in recs])
    y = torch.cat([torch.full((keep,), r.label, dtype=torch.long, device=x.device) for r in recs])
    return x, y
