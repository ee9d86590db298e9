"""The model keys each ``model.train`` of a pretrained backbone reads (its adapter's): the others are refused
away from their defaults (``cfl/pretrained/loaded.py``) and left out when saved configs are compared
(``cfl/records/saved_configs.py``)."""

from __future__ import annotations

#: the model keys each ``model.train`` reads (the others are refused away from their defaults)
ADAPTER_KEYS = {"prompts": ("prompt_pool", "prompt_length", "prompt_top_k", "classifier"),
                "components": ("prompt_pool", "prompt_length", "component_layers", "classifier"),
                "task-components": ("prompt_pool", "prompt_length", "prompt_blocks"),
                "lora": ("lora_rank", "lora_alpha", "lora_targets", "lora_layers", "lora_tasks", "classifier"),
                "dual-prompts": ("prompt_pool", "prompt_length", "prompt_top_k", "g_prompt_length", "g_prompt_layers",
                                 "e_prompt_layers", "classifier"),
                "all": ("classifier",)}
