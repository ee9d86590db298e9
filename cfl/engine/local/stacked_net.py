"""Clients trained as stacked tensor operations, with each linear layer's SGD step fused into its backward.

For models that list their layers (``stack_layers()``: :class:`cfl.models.MLP` and the AlexNet-like net)
(no method with a per-sample extra loss or a gradient projection; quadratic penalties take a fused step:
:mod:`cfl.engine.local.path`) the batched engine skips ``vmap`` and runs the
stack of clients directly: linear activations ``(C, B, F)`` with weights ``(C, out, in)`` (``nn.Linear``'s
own layout, so stacking and returning the clients' weights copies nothing transposed); convolutions on
``(B, C*channels, H, W)`` as one grouped convolution (``groups=C``), so pooling, ReLU and dropout run on
that layout too and the data moves between layouts only at the first convolution and the flatten. On
CPU that tensor is stored channels-last: torch's max-pooling is vectorised only there (1.8 ms against
0.15 ms at the AlexNet-like net's first pooling, batch 16) and oneDNN's convolutions prefer it.
A linear layer's backward computes the gradient of its input, then applies the step to its own weights
in place with one ``baddbmm_``::

    W <- (1 - lr*wd) W - lr * dY^T X          (torch.optim.SGD's step with weight decay)

so the weight gradient is never materialised. A ReLU and dropout that follow a linear layer run inside
it, in place on its fresh output (the bias add and the ReLU as one pass); the layer hands its
activations over without the dropout scale, which the next linear layer applies as its products'
``alpha`` (:class:`cfl.engine.local.stacked_kernels.FusedLinearSGD`). Writing a fresh (C, out, in) gradient
and reading it back in a separate update pass cost more than the product itself (fresh pages, three memory passes); the
fused step writes into memory that is already mapped, and the weight gradient of the first layer drops
from ~100 ms to ~45 ms per step at 64 clients on one core (``docs/performance.md``).

In bf16-mixed (``precision``, :mod:`cfl.engine.local.precision`) the products above and the convolutions take
bfloat16 operands over the float32 weights, which every step still updates in float32.

With momentum, Adam or AdamW (:mod:`cfl.engine.local.local_optim`) the backward materialises the weight gradient
``dY^T X`` instead and hands it, with a quadratic penalty's gradient, to :meth:`StackedNet.step`, which keeps
the optimiser's per-client state.

Correctness: each layer's gradient depends on its saved input and on the gradient flowing in from the
layers above, which compute their input gradients before they step, so every gradient is taken at the
step's starting weights, as in the vmap path. Parameters outside the fused layers (convolutions, a
multi-head output layer) get ordinary autograd gradients and the same step afterwards.
"""

from __future__ import annotations

import torch
from torch import nn

from cfl.config.precision import is_mixed
from cfl.engine.local import local_optim
from cfl.engine.local.hooks import precondition
from cfl.engine.local.jobs import Hyper
from cfl.engine.local.precision import LOW, Bf16Weights, to_float
from cfl.engine.local.scratch import Scratch
from cfl.engine.local.stacked_kernels import FusedLinearSGD, PenaltyStep, ReluDropout, penalty_pre_step
from cfl.heads import MultiHead, SharedHead
from cfl.models.dropout import Dropout
from cfl.tensors import Params


class StackedNet:
    """The forward of a model with ``stack_layers()`` over ``C`` stacked clients, and its fused SGD step."""

    # layers that treat samples independently only: the stack's weight-0 padding samples (a client's short
    # batch) must not change the real ones' outputs, so no BatchNorm on batch statistics here
    KNOWN = (nn.Flatten, nn.Linear, nn.ReLU, Dropout, nn.Conv2d, nn.MaxPool2d)

    def __init__(self, model: nn.Module, hp: Hyper) -> None:
        if hp.lr_groups:  # cfl.engine.local.path.stacked_refusal: the fused steps take one learning rate
            raise ValueError("the stacked path steps every parameter at hp.lr; lr_groups trains on the vmap path")
        self.hp, self.lr, self.decay = hp, hp.lr, 1.0 - hp.lr * hp.weight_decay
        # momentum or Adam: per-parameter optimiser state over the stacked clients (:meth:`new_state`), and
        # the step count of the step being taken (:meth:`step`); plain SGD has none and steps in place
        self.stateful = not local_optim.plain_sgd(hp)
        self.slots: dict[str, list[torch.Tensor]] = {}
        self.t = 0
        # the step's layer preconditioners (``Method.round_terms``' preconditioner): weight name -> (C or 1, d, d)
        self.preconditioners: dict[str, torch.Tensor] = {}
        # bf16-mixed: bfloat16 copies of the fused weights and their products' buffers (kept by :meth:`stack`)
        self.bf16 = Bf16Weights({}) if is_mixed(hp.precision) else None
        self.layers: list[tuple[str, nn.Module]] = model.stack_layers()
        self.head = model.head
        # buffers the fused layers write into, kept in the trainer's workspace (:meth:`stack`)
        self.scratch: Scratch | None = None
        self.fused = {f"{name}.{p}" for name, m in self.layers if isinstance(m, nn.Linear) for p in ("weight", "bias")}
        if isinstance(self.head, SharedHead):
            self.fused |= {"head.weight", "head.bias"}

    @classmethod
    def model_refusal(cls, model: nn.Module) -> str | None:
        """Why this path cannot run ``model`` (None: it can): it must list known layers (``stack_layers()``)
        that treat samples independently, and end in a shared or multi-task head."""
        name = type(model).__name__
        if not hasattr(model, "stack_layers"):
            return f"model {name} does not list its layers (stack_layers())"
        layers = [m for _, m in model.stack_layers()]
        unknown = sorted({type(m).__name__ for m in layers if not isinstance(m, cls.KNOWN)})
        if unknown:
            return f"model {name} has layers the stacked path does not run: {', '.join(unknown)}"
        if not all(m.start_dim == 1 and m.end_dim == -1 for m in layers if isinstance(m, nn.Flatten)):
            return f"model {name} flattens other dims than all but the batch dim"
        if not all(m.groups == 1 and m.padding_mode == "zeros" for m in layers if isinstance(m, nn.Conv2d)):
            return f"model {name} has grouped or non-zero-padded convolutions"
        if not isinstance(getattr(model, "head", None), (SharedHead, MultiHead)):
            return f"model {name} has no SharedHead or MultiHead head"
        return None

    def stack(self, global_params: Params, C: int, workspace: Params | None = None) -> Params:
        """The global parameters repeated over clients, contiguous ``(C, ...)`` in their own layout.

        ``workspace``: buffers kept by the caller between rounds and overwritten here (allocated, and
        stored in it, on first use or when a shape changes), so a round writes into memory that is
        already mapped instead of faulting in ~160 MB of fresh pages (64 MLP clients).
        """
        workspace = {} if workspace is None else workspace
        if self.bf16 is not None:
            self.bf16 = Bf16Weights(workspace)
        self.scratch = Scratch(workspace)
        out = {}
        for k, v in global_params.items():
            buf = workspace.get(k)
            if buf is None or buf.shape != (C, *v.shape) or buf.dtype != v.dtype or buf.device != v.device:
                buf = workspace[k] = torch.empty((C, *v.shape), dtype=v.dtype, device=v.device)
            out[k] = buf
        # one operator for all: not Tensor.repeat (70 ms against 9), not one copy per parameter
        torch._foreach_copy_(list(out.values()), [v.detach().expand(C, *v.shape) for v in global_params.values()])
        return out

    def leaves(self, params: Params) -> Params:
        """The stacked parameters ready to train in place: those outside the fused layers become leaves
        that require grad (sharing storage, so their steps land in ``params``)."""
        return {k: v if k in self.fused else v.detach().requires_grad_() for k, v in params.items()}

    def penalty_steps(self, terms: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
                      params: Params) -> dict[str, PenaltyStep]:
        """Per parameter, the ``(M, N)`` of :func:`penalty_pre_step` for the round's quadratic penalties (each
        method's ``A * w - B`` terms, :func:`cfl.engine.local.hooks.penalty_terms`), each with as many dims as the
        stacked parameter (client dim 1 where it is the same for every client)."""
        total: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for method_terms in terms:
            for k, (a, b) in method_terms.items():  # summed over methods; each (C, ...) op below is a fresh ~160 MB
                a0, b0 = total.get(k, (None, None))
                total[k] = (_plus(a0, a), _plus(b0, b))
        steps = {}
        coeff = self.lr / self.decay
        for k, (a, b) in total.items():
            dims = params[k].dim()
            if self.stateful:  # the optimiser adds the penalty's gradient A * w - B itself (:meth:`step`)
                steps[k] = (None if a is None else a.reshape(_client_first(a, dims)),
                            None if b is None else b.reshape(_client_first(b, dims)))
                continue
            if a is None:  # linear terms only (SCAFFOLD's correction): p + lr/decay * B
                steps[k] = (None, torch.mul(b, coeff).reshape(_client_first(b, dims)))
                continue
            # into kept buffers: two fresh (C, ...) tensors a parameter a round cost page faults (EWC: ~300 MB)
            m = torch.mul(a, -coeff, out=self._kept(f"{k}.penalty_m", a)).add_(1.0)
            n = None if b is None else torch.mul(b, coeff, out=self._kept(f"{k}.penalty_n", b))
            steps[k] = (m.reshape(_client_first(m, dims)), None if n is None else n.reshape(_client_first(n, dims)))
        return steps

    def _kept(self, key: str, like: torch.Tensor) -> torch.Tensor | None:
        """A scratch buffer shaped as ``like`` (None before :meth:`stack`: a fresh tensor then)."""
        return None if self.scratch is None else self.scratch.get(key, tuple(like.shape), like.dtype, like.device)

    def forward(self, params: Params, x: torch.Tensor, task: torch.Tensor, token: torch.Tensor,
                penalty: dict[str, PenaltyStep] | None = None) -> torch.Tensor:
        """Logits ``(C, B, classes)`` of stacked inputs ``(C, B, ...)`` and task ids ``(C, B)``; ``penalty``:
        :meth:`penalty_steps` for these clients, applied in each fused layer's step."""
        penalty = penalty or {}
        C, B = x.shape[:2]
        self._draw_masks(C * B, x.device)
        h, grouped = x, False  # grouped: h is (B, C*channels, H, W)
        scale = 1.0  # dropout scale still owed by ``h`` (a fused linear layer hands its output over unscaled)
        i = 0
        while i < len(self.layers):
            name, module = self.layers[i]
            relu, dropout = self._activation_after(i)
            if isinstance(module, nn.Linear):
                h = self._linear(params, name, h, token, penalty, scale, relu, dropout)
                scale = 1.0 / dropout.keep_prob if dropout is not None else 1.0
                i += 1 + relu + (dropout is not None)
                continue
            h, scale = (h if scale == 1.0 else h * scale), 1.0  # out of place: h is saved for the backward
            if isinstance(module, nn.ReLU) and dropout is not None:
                h = ReluDropout.apply(h, dropout.keep_mask(h), 1.0 / dropout.keep_prob)
                i += 1  # the dropout is done
            elif isinstance(module, nn.Conv2d):
                if not grouped:
                    h, grouped = h.transpose(0, 1).reshape(B, C * h.shape[2], *h.shape[3:]), True
                    if h.is_cpu:  # max-pooling is ~10x and the conv stack ~1.3x faster in this layout on CPU
                        h = h.contiguous(memory_format=torch.channels_last)
                w = params[f"{name}.weight"]
                bias = params.get(f"{name}.bias")
                if self.bf16 is not None:  # bf16-mixed: the convolution in bfloat16, float32 weight gradients
                    h, w, bias = h.to(LOW), w.to(LOW), None if bias is None else bias.to(LOW)
                h = nn.functional.conv2d(h, w.reshape(-1, *w.shape[2:]), None if bias is None else bias.reshape(-1),
                                         module.stride, module.padding, module.dilation, groups=C)
            elif isinstance(module, nn.Flatten):
                h = h.reshape(B, C, -1).transpose(0, 1).contiguous() if grouped else h.flatten(2)
                grouped = False
            elif isinstance(module, nn.ReLU):
                h = torch.relu(h)
            else:
                h = module(h)  # dropout (one independent mask over the whole stack) or max-pooling
            i += 1
        if isinstance(self.head, SharedHead):
            return to_float(self._linear(params, "head", h, token, penalty, scale))
        logits = to_float(torch.einsum("cbf,ctkf->cbtk", h, params["head.weight"].to(h.dtype)))
        if scale != 1.0:
            logits = logits * scale
        if "head.bias" in params:
            logits = logits + params["head.bias"].unsqueeze(1)
        index = task.view(*task.shape, 1, 1).expand(-1, -1, 1, logits.shape[-1])
        return logits.gather(2, index).squeeze(2)

    def _draw_masks(self, rows: int, device: torch.device) -> None:
        """Draw the noise of every dropout mask of the step at once (one operator, not one per layer) into
        :attr:`Scratch.drawn`, where all the net's training dropouts follow its fused linear layers (the MLP):
        the layers' words in their order, on the CPU the same words as one draw per layer (its generator's
        stream is consumed word by word; on a GPU an equally random other draw). Else each layer draws its own."""
        if self.scratch is None:
            return
        self.scratch.drawn = {}
        plan = [(name, dropout, rows * module.out_features) for i, (name, module) in enumerate(self.layers)
                if isinstance(module, nn.Linear) and (dropout := self._activation_after(i)[1]) is not None]
        training = sum(isinstance(m, Dropout) and m.training and m.p > 0 for _, m in self.layers)
        if len(plan) < 2 or len(plan) != training:
            return
        counts = [dropout.noise_words(numel) for _, dropout, numel in plan]
        words = self.scratch.get("noise", (sum(counts),), torch.int64, device).random_(-(2**63), None)
        self.scratch.drawn = {name: w for (name, _, _), w in zip(plan, words.split(counts), strict=True)}

    def _activation_after(self, i: int) -> tuple[bool, Dropout | None]:
        """Whether layer ``i`` (a linear layer) is followed by a ReLU, and the training dropout after that."""
        after = [m for _, m in self.layers[i + 1 : i + 3]]
        relu = bool(after) and isinstance(after[0], nn.ReLU)
        if isinstance(self.layers[i][1], nn.ReLU):  # layer i is the ReLU itself: is a dropout next?
            relu, after = True, [None, *after]
        dropout = after[1] if relu and len(after) > 1 else None
        if not isinstance(dropout, Dropout) or not dropout.training or dropout.p == 0:
            dropout = None
        return relu, dropout

    def _linear(self, params: Params, name: str, h: torch.Tensor, token: torch.Tensor,
                penalty: dict[str, PenaltyStep], scale: float = 1.0, relu: bool = False,
                dropout: Dropout | None = None) -> torch.Tensor:
        return FusedLinearSGD.apply(h, params[f"{name}.weight"], params.get(f"{name}.bias"), token, self.lr,
                                    self.decay, scale, relu, dropout,
                                    (penalty.get(f"{name}.weight"), penalty.get(f"{name}.bias")),
                                    None if self.bf16 is None else (self.bf16, name),
                                    (self, name) if self.stateful else None,
                                    self.preconditioners.get(f"{name}.weight"),
                                    None if self.scratch is None else (self.scratch, name))

    def new_state(self, params: Params, kept: dict[str, list[torch.Tensor]] | None = None) -> None:
        """Fresh (zero) optimiser state for the stacked ``params`` of a block of clients (momentum, Adam), or the
        clients' ``kept`` state (``optimizer.state: kept``, :func:`cfl.engine.local.local_optim.kept_state`)."""
        if kept is not None:
            self.slots = kept
            return
        self.slots = {k: local_optim.new_slots(self.hp, v) for k, v in params.items()} if self.stateful else {}

    def step(self, name: str, p: torch.Tensor, g: torch.Tensor, penalty: PenaltyStep | None) -> None:
        """The optimiser's step of the stacked parameter ``p`` (the clients still training: a prefix of the
        block) from its loss gradient ``g``, plus the quadratic penalty's gradient ``A * p - B``, at step
        :attr:`t`; :mod:`cfl.engine.local.local_optim`."""
        if penalty is not None:
            a, b = penalty
            g = g.clone() if a is None else torch.addcmul(g, a, p)
            if b is not None:
                g.sub_(b)
        t = self.t if isinstance(self.t, int) else self.t[: p.shape[0]]
        local_optim.step_(self.hp, p, g, [slot[: p.shape[0]] for slot in self.slots[name]], t)

    def backward_and_step(self, loss: torch.Tensor, params: Params, token: torch.Tensor,
                          penalty: dict[str, PenaltyStep] | None = None, grad: torch.Tensor | None = None) -> None:
        """Back-propagate ``loss`` (the sum of the clients' losses; or, with ``grad``, the tensor whose gradient
        ``grad`` is: the logits and the summed losses' gradient) and take every parameter's step (with the
        :meth:`penalty_steps` given to :meth:`forward`)."""
        penalty = penalty or {}
        rest = [k for k in params if k not in self.fused]
        grads = torch.autograd.grad(loss, [token] + [params[k] for k in rest], grad, allow_unused=True)[1:]
        with torch.no_grad():
            for k, g in zip(rest, grads, strict=True):
                if g is not None and k in self.preconditioners:  # a weight outside the fused layers (conv, heads)
                    g = precondition(g, self.preconditioners[k])
                if self.stateful:
                    self.step(k, params[k], torch.zeros_like(params[k]) if g is None else g, penalty.get(k))
                    continue
                penalty_pre_step(params[k], penalty.get(k))
                params[k].mul_(self.decay)
                if g is not None:
                    params[k].add_(g, alpha=-self.lr)


def _client_first(t: torch.Tensor, dims: int) -> tuple[int, ...]:
    """The shape of ``t`` (clients or 1 first, then a parameter's trailing dims) with 1s inserted after the
    client dim up to ``dims`` dims, so that it broadcasts against the stacked parameter."""
    return (t.shape[0],) + (1,) * (dims - t.dim()) + tuple(t.shape[1:])


def _plus(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
    """``x + y``, where None stands for 0."""
    return y if x is None else x if y is None else x + y
