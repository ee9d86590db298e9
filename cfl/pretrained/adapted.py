"""A pretrained ViT that trains through its frozen backbone (``model.train: prompts | components | dual-prompts |
lora | all``):
the backbone's weights are **buffers** of the model, not parameters, so the engine never stacks, copies,
uploads or checkpoints them per client. Only the trainable subset is a parameter: the prompt pool and its keys
(``prompts``), CODA-P's components (``components``: as attention prefixes of the first ``component_layers``
blocks, or prepended to the tokens), Powder's task-correlated components (``task-components``: prepended before
each of ``prompt_blocks``), DualPrompt's G- and E-prompts, prefixes of the first blocks'
attention (``dual-prompts``), the LoRA factors of the blocks' attention ``qkv`` projections (``lora``: every
block's whole projection, or per task and on the query and value parts of the first ``lora_layers``: PILoRA's), or
everything (``all``: full fine-tuning), and always the head (linear, or ``model.classifier: prototype``: a centre
per class, cfl/pretrained/prototype_head.py).

In the batched trainer each client's forward is ``functional_call(model, its_params, ...)`` under ``vmap``: the
frozen buffers are not in the per-client parameters, so ``vmap`` sees them as one unbatched input (``in_dims=None``)
and every linear layer of the backbone is one product over all sampled clients' samples at once: one backbone
pass per step for every client, where a per-client loop runs one pass per client. Attention runs timm's
non-fused path (explicit softmax of ``q k^T``): torch has no ``vmap`` rule for the fused CPU kernel, which would
fall back to a loop over clients (a custom operator folding the clients into the kernel's batch was measured at
224 px on the 2-core AMD EPYC: the kernel's backward costs more than the explicit form saves, 0.96 s against
0.90 s of attention a round, so it is not used).

The last block runs over the rows the head reads only (the [CLS] token, or L2P's prompt tokens): the keys and
values of every row, the rest of the block for those rows (cfl/pretrained/final_block.py).

Inputs: the stream's images mapped to the backbone's normalisation at their own size (``image_stream``); the
model resizes them to its input size (resizing commutes with the per-channel affine normalisation).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from torch import nn

from cfl.heads import make_head
from cfl.pretrained.coda_prompt import ComponentPrompt
from cfl.pretrained.dual_prompt import DualPrompts
from cfl.pretrained.final_block import has_token_pool, normed_rows, pooled
from cfl.pretrained.lora import LoRALinear
from cfl.pretrained.prefix_attention import prefixed_block
from cfl.pretrained.preprocessing import MODES
from cfl.pretrained.prompt_pool import PromptPool
from cfl.pretrained.prototype_head import PrototypeHead
from cfl.pretrained.queries import QUERY_MODES, PackedLayout, resized
from cfl.pretrained.task_lora import TaskLoRALinear
from cfl.pretrained.task_prompts import TaskComponents
from cfl.tensors import nbytes

TRAIN_MODES = ("prompts", "components", "task-components", "dual-prompts", "lora", "all")


def freeze_into_buffers(module: nn.Module) -> int:
    """Every parameter of ``module`` re-registered as a non-persistent buffer of its owner; the number of values."""
    count = 0
    for owner in module.modules():
        for name, p in list(owner.named_parameters(recurse=False)):
            delattr(owner, name)
            owner.register_buffer(name, p.detach(), persistent=False)
            count += p.numel()
    return count


class AdaptedViT(nn.Module):
    """``model(x, task)``: the timm ViT ``vit`` (copied) frozen except for its adapter, and a head."""

    def __init__(self, vit: nn.Module, train: str, classes: int, num_tasks: int, multi_head: bool, size: int,
                 interpolation: str, prompt: tuple[int, int, int] = (10, 5, 5), lora: tuple[int, float] = (4, 4.0),
                 dual: tuple[int, int, int] = (5, 2, 3), component_layers: int = 0,
                 layout: PackedLayout | None = None, lora_form: tuple[str, int, str] = ("qkv", 0, "shared"),
                 classifier: str = "linear", prompt_blocks: tuple[int, ...] = (4, 5, 6)):
        super().__init__()
        if train not in TRAIN_MODES:
            raise ValueError(f"model.train {train!r} is not one of {TRAIN_MODES}")
        self.train_mode, self.size, self.mode = train, size, MODES[interpolation]
        if layout is not None and train not in QUERY_MODES:
            raise ValueError(f"model.train {train!r} reads no query: its inputs are not packed with one")
        self.layout = layout  # inputs packed with their frozen queries (cfl/pretrained/queries.py), or None
        self.vit = copy.deepcopy(vit)
        for block in self.vit.blocks:
            block.attn.fused_attn = False  # vmap batches the explicit attention; the fused CPU kernel it loops
        self.frozen_values = 0 if train == "all" else freeze_into_buffers(self.vit)
        self.vit.requires_grad_(train == "all")
        # the last block over the head's rows only (cfl/pretrained/final_block.py); full fine-tuning trains that
        # block's weights over every row, so it runs timm's whole block
        self.rows_only = train != "all" and has_token_pool(self.vit)
        if train != "all" and not self.rows_only:
            print(f"model.train: {train}: the backbone's last block or pooling is not timm's plain ViT's ([CLS] "
                  "token); that block runs over every token (slower than over the head's rows)", file=sys.stderr,
                  flush=True)
        width = self.vit.num_features
        self.prompt = PromptPool(*prompt, width) if train == "prompts" else \
            ComponentPrompt(prompt[0], prompt[1], width, component_layers) if train == "components" else \
            DualPrompts(*prompt, width, *dual) if train == "dual-prompts" else \
            TaskComponents(num_tasks, prompt[0], prompt[1], width, len(prompt_blocks)) \
            if train == "task-components" else None
        self.prompt_blocks = tuple(prompt_blocks)
        if train == "task-components" and (list(prompt_blocks) != sorted(set(prompt_blocks)) or not prompt_blocks
                                           or not 0 <= prompt_blocks[0] <= prompt_blocks[-1] < len(self.vit.blocks)):
            raise ValueError(f"model.prompt_blocks {list(prompt_blocks)} must be distinct block indices in increasing "
                             f"order within the backbone's 0..{len(self.vit.blocks) - 1}")
        if train == "components" and component_layers > len(self.vit.blocks):
            raise ValueError(f"model.component_layers {component_layers} exceeds the backbone's "
                             f"{len(self.vit.blocks)} blocks")
        if train == "dual-prompts" and dual[1] + dual[2] > len(self.vit.blocks):
            raise ValueError(f"the G- and E-prompts' {dual[1]} + {dual[2]} layers exceed the backbone's "
                             f"{len(self.vit.blocks)} blocks")
        if train == "lora":
            self.adapt_qkv(lora, lora_form, num_tasks)
        self.head = PrototypeHead(width, classes, num_tasks, multi_head) if classifier == "prototype" else \
            make_head(width, classes, num_tasks, multi_head)

    def adapt_qkv(self, lora: tuple[int, float], form: tuple[str, int, str], num_tasks: int) -> None:
        """LoRA factors on the qkv projections of the first ``layers`` blocks (0: all): one pair of the whole
        projection shared by the tasks (cfl/pretrained/lora.py), or per task and adapted part (task_lora.py)."""
        targets, layers, tasks = form
        if layers > len(self.vit.blocks):
            raise ValueError(f"model.lora_layers {layers} exceeds the backbone's {len(self.vit.blocks)} blocks")
        for block in self.vit.blocks[:layers or len(self.vit.blocks)]:
            block.attn.qkv = LoRALinear(block.attn.qkv, *lora) if (targets, tasks) == ("qkv", "shared") else \
                TaskLoRALinear(block.attn.qkv, *lora, num_tasks if tasks == "per-task" else 1, targets)

    def resized(self, x: torch.Tensor) -> torch.Tensor:
        return resized(x, self.size, self.mode)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """The prompt methods' query of ``x``: the frozen backbone's [CLS] feature (no gradient), read from packed
        rows (computed once per sample when the run started) or computed here."""
        if self.layout is not None:
            return self.layout.split(x)[1]
        with torch.no_grad():
            return pooled(self.vit, self.resized(x))

    def features(self, x: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input; ``task`` (the inputs' tasks) is read by ``dual-prompts`` at training only."""
        x, query = (x, None) if self.layout is None else self.layout.split(x)
        x = self.resized(x)
        v = self.vit
        if self.prompt is None:  # timm's pooled pre-logits: the [CLS] token after the final norm
            return pooled(v, x) if self.rows_only else v(x)
        tokens = v.norm_pre(v.patch_drop(v._pos_embed(v.patch_embed(x))))  # [CLS] and patches, with positions
        if self.train_mode == "dual-prompts" or getattr(self.prompt, "layers", 0):
            return self.prefixed_features(x, tokens, task, query)
        if self.train_mode == "task-components":
            return self.task_prompted_features(x, tokens, task, query)
        prompts = self.prompt(self.query(x) if query is None else query)
        tokens = v.blocks[:-1](torch.cat([tokens[:, :1], prompts, tokens[:, 1:]], 1))  # the prompts after [CLS]
        if self.train_mode == "components":
            return self.normed_rows(tokens, slice(0, 1))[:, 0]  # CODA-P's head input: the [CLS] token's output
        # L2P's head input: the prompt tokens' outputs, averaged
        return self.normed_rows(tokens, slice(1, 1 + prompts.shape[1])).mean(1)

    def normed_rows(self, tokens: torch.Tensor, rows: slice, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm's output at ``rows`` after the last block of ``tokens`` (its input)."""
        if self.rows_only:
            return normed_rows(self.vit, tokens, rows, prefix)
        return self.vit.norm(prefixed_block(self.vit.blocks[-1], tokens, prefix))[:, rows]

    def prefixed_features(self, x: torch.Tensor, tokens: torch.Tensor, task: torch.Tensor | None,
                          query: torch.Tensor | None = None) -> torch.Tensor:
        """The head input of a prefix form: the [CLS] output of blocks whose first layers attend to the prefixes
        (DualPrompt's official ``head_type: token``; CODA-P's ``out[:, 0, :]``). DualPrompt: at training each
        input's E-prompts are its task's, else its query's; CODA-P: its components, weighted by its query (``query``:
        given, or computed from the resized images ``x``)."""
        query = self.query(x) if query is None else query
        if self.train_mode == "components":
            prefixes = self.prompt(query)
        elif self.training and task is None:
            raise ValueError("model.train: dual-prompts trains each input's task's E-prompts: pass its task")
        else:
            prefixes = self.prompt(query, task if self.training else None)
        blocks = len(self.vit.blocks)
        for i, block in enumerate(self.vit.blocks[:-1]):
            tokens = prefixed_block(block, tokens, prefixes[i] if i < len(prefixes) else None)
        return self.normed_rows(tokens, slice(0, 1), prefixes[blocks - 1] if blocks <= len(prefixes) else None)[:, 0]

    def task_prompted_features(self, x: torch.Tensor, tokens: torch.Tensor, task: torch.Tensor | None,
                               query: torch.Tensor | None = None) -> torch.Tensor:
        """Powder's head input: each input's task's composed prompt prepended to the tokens before each of
        ``prompt_blocks`` (they accumulate), then the [CLS] token's output (the code's ``out[:, L * length]``)."""
        if task is None:
            raise ValueError("model.train: task-components composes each input's prompt from its task: pass its task")
        prompts = self.prompt(self.query(x) if query is None else query, task)  # (N, L, length, D)
        layer, last = 0, len(self.vit.blocks) - 1
        for i, block in enumerate(self.vit.blocks):
            if i in self.prompt_blocks:
                tokens = torch.cat([prompts[:, layer], tokens], 1)
                layer += 1
            if i < last:
                tokens = block(tokens)
        row = layer * prompts.shape[2]
        return self.normed_rows(tokens, slice(row, row + 1))[:, 0]

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x, task), task)

    def summary(self) -> str:
        """The line a run prints: which parameters train and what one client sends per round."""
        params = dict(self.named_parameters())
        groups: dict[str, int] = {}
        for k, v in params.items():
            prompt = "prompts, keys and attention" if self.train_mode in ("components", "task-components") else \
                "G-prompts, E-prompts and keys" if self.train_mode == "dual-prompts" else "prompts and keys"
            group = "head" if k.startswith("head.") else prompt if k.startswith("prompt.") else \
                "LoRA factors" if ".lora_" in k else "backbone"
            groups[group] = groups.get(group, 0) + v.numel()
        trained = ", ".join(f"{g} {n:,}" for g, n in groups.items())
        frozen = (f"the frozen backbone's {self.frozen_values:,} values are shared by all clients (one backbone "
                  "pass per step for every sampled client), never stacked, uploaded or checkpointed per client"
                  if self.frozen_values else "nothing is frozen (full fine-tuning: every client holds the whole "
                  "backbone)")
        return (f"model.train: {self.train_mode}: {len(params)} tensors train ({trained} values); each client "
                f"sends {nbytes(params):,} bytes per round; {frozen}")


def adapted_model(cfg: Any, classes: int, num_tasks: int, multi_head: bool, quiet: bool = False,
                  layout: PackedLayout | None = None) -> AdaptedViT:
    """The run's model for ``model.train`` other than ``head``: the loaded backbone (cfl/pretrained/loaded.py),
    adapted; says on stderr which parameters train and the bytes a client sends. ``layout``: the stream's rows
    packed with their queries (:func:`cfl.pretrained.queries.layout_of`), or None."""
    from cfl.pretrained.loaded import loaded_backbone

    backbone = loaded_backbone(cfg)
    m = cfg.model
    model = AdaptedViT(backbone.model, m.train, classes, num_tasks, multi_head, backbone.preprocessing.size,
                       backbone.preprocessing.interpolation, (m.prompt_pool, m.prompt_length, m.prompt_top_k),
                       (m.lora_rank, m.lora_alpha), (m.g_prompt_length, m.g_prompt_layers, m.e_prompt_layers),
                       m.component_layers, layout, (m.lora_targets, m.lora_layers, m.lora_tasks), m.classifier,
                       tuple(m.prompt_blocks))
    if not quiet:
        print(model.summary(), file=sys.stderr, flush=True)
    return model
