"""The run configuration's ``model`` section (cfl/config/keys.py ``Config.model``): which model, its BatchNorm buffers,
and a pretrained backbone's weights file and what trains on it (prompts, components, LoRA factors, the classifier).
Every key is documented here; ``cfl config-reference`` prints the table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cfl.config.schema import field


@dataclass(frozen=True)
class ModelConfig:
    name: str = field("auto", "model name (see `cfl list`); auto: the stream's reference model, written as its "
                      "name into the resolved config.yaml and results.json")
    buffers: str = field("averaged", "a model with BatchNorm running statistics (e.g. resnet18-reduced-running-bn): "
                         "averaged, the clients' buffers averaged by the server like the parameters (weighted by "
                         "sample counts; num_batches_tracked: the weighted mean, rounded down) and sent down with "
                         "them; local (FedBN), each client keeps its own across its rounds and only uploads them, "
                         "and evaluation uses their weighted mean over the last round's clients (docs/concepts.md)",
                         choices=("averaged", "local"))
    weights: Optional[str] = field(None, "pretrained backbones (vit-ti16, vit-s16, vit-b16; the extra pretrained): "
                                   "a local weights file (.safetensors, .pth or .npz; never downloaded) or random (an "
                                   "untrained backbone: flagged in results.json and every table, figure and W&B name); "
                                   "required for them, refused for other models (docs/pretrained.md)")
    weights_sha256: Optional[str] = field(None, "the weights file's SHA-256 (hex): a file that differs is refused "
                                          "(null: not checked; the hash read is recorded in results.json)")
    weights_trained: bool = field(False, "true: the weights file is trained although its statistics are an "
                                  "initialisation's (every LayerNorm at weight 1 and bias 0), so it is not flagged "
                                  "as a random backbone (docs/pretrained.md)")
    weights_origin: Optional[str] = field(None, "a few words on where a weights file comes from when it is not what "
                                          "a reader would assume (e.g. 'in-house backbone, not ImageNet'): shown in "
                                          "parentheses after the method in results.json, every table row, figure "
                                          "legend and W&B name; refused with weights: random (flagged already)")
    image_size: Optional[int] = field(None, "pretrained backbones: input size in pixels (null: the backbone's "
                                      "pretrained config, 224); a different size resamples a weights file's position "
                                      "embeddings (timm's filter)", min=16)
    train: str = field("head", "pretrained backbones: what trains; head: the backbone is frozen, its features of "
                       "every sample are computed once (cached on disk) and the run trains a head on them (linear "
                       "probing; fedncm, afcl, ranpac); prompts (an L2P prompt pool and its keys, method l2p), "
                       "components (CODA-P's prompt components, keys and attention vectors, method codap or "
                       "fedcprompt), task-components (Powder's per-task components composed by the task "
                       "correlation, prepended before model.prompt_blocks, method powder), dual-prompts "
                       "(DualPrompt's G- and E-prompts as attention prefixes, method dualprompt), lora (LoRA "
                       "factors of the attention qkv projections, method lora, lorm or pilora) or all (full "
                       "fine-tuning): the images go through the backbone each step, frozen and shared by all "
                       "clients, and only what trains is kept per client and sent (docs/pretrained.md)",
                       choices=("head", "prompts", "components", "task-components", "dual-prompts", "lora", "all"))
    prompt_pool: int = field(10, "model.train: prompts | components | task-components | dual-prompts: prompts in the "
                             "pool (L2P's M; CODA-P's components; Powder's components of each task; DualPrompt's "
                             "E-prompts)", min=1, max=4096)
    prompt_length: Optional[int] = field(None, "model.train: prompts | components | task-components | dual-prompts: "
                                         "tokens per prompt "
                                         "(L2P's L_p; CODA-P's prompt length; DualPrompt's E-prompt length); null: "
                                         "the official code's, 5 (L2P, DualPrompt), 8 (CODA-P's prefix form, Powder) "
                                         "or 5 (components with component_layers: 0)", min=1, max=1024)
    prompt_top_k: int = field(5, "model.train: prompts | dual-prompts: prompts each input selects (L2P's N; "
                              "DualPrompt's official 1; at most prompt_pool)", min=1, max=4096)
    g_prompt_length: int = field(5, "model.train: dual-prompts: tokens of DualPrompt's G-prompt (the official 5)",
                                 min=1, max=1024)
    g_prompt_layers: int = field(2, "model.train: dual-prompts: the first blocks that take the G-prompt (the "
                                 "official layers 0-1: 2)", min=0, max=64)
    e_prompt_layers: int = field(3, "model.train: dual-prompts: the blocks after them that take the E-prompts (the "
                                 "official layers 2-4: 3)", min=1, max=64)
    component_layers: int = field(5, "model.train: components: the first blocks whose attention takes CODA-P's "
                                  "components as prefixes (prefix tuning: a prompt's first prompt_length / 2 tokens "
                                  "the keys, the rest the values; the official layers 0-4: 5); 0: prompt tuning, "
                                  "the weighted prompt prepended after [CLS] (cfl's form before 2026-12-03)",
                                  min=0, max=64)
    prompt_blocks: list[int] = field([4, 5, 6], "model.train: task-components: the blocks before which each "
                                     "input's composed prompt is prepended (the tokens accumulate; Powder's official "
                                     "4, 5, 6)")
    lora_rank: int = field(4, "model.train: lora: rank r of the factors", min=1, max=4096)
    lora_alpha: float = field(4.0, "model.train: lora: the update is scaled by lora_alpha / lora_rank", gt=0,
                              max=1e6)
    lora_targets: str = field("qkv", "model.train: lora: the outputs the factors adapt: qkv (the whole attention qkv "
                              "projection, one factor pair) or qv (the query and value parts, a pair each: LoRA's "
                              "paper, PILoRA's code)", choices=("qkv", "qv"))
    lora_layers: int = field(0, "model.train: lora: the first blocks whose attention takes factors (0: every block; "
                             "PILoRA's code: 1)", min=0, max=64)
    lora_tasks: str = field("shared", "model.train: lora: shared (one set of factors for every task) or per-task "
                            "(each task its own factors, the forward adding every task's B_t A_t: PILoRA, Guo et al. "
                            "2024; a method trains its task's only)", choices=("shared", "per-task"))
    classifier: str = field("linear", "model.train other than head: the classifier on the backbone's features: linear "
                            "(a linear head) or prototype (one learned centre per class, logits -sqrt(|f - c|^2 / D): "
                            "PILoRA's)", choices=("linear", "prototype"))
