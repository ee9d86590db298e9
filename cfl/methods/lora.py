"""LoRA (Hu et al., ICLR 2022) on a frozen pretrained ViT, federated by FedAvg of the factors and the head: the
plain federated LoRA baseline of the federated continual papers (e.g. PILoRA, Guo et al. 2024; LoRM, Salami et al.
ICLR 2025). The model (``model.train: lora``, cfl/pretrained/adapted.py and lora.py) adds ``(alpha / r) B A`` to
every block's attention ``qkv`` projection; one client's math is the cross-entropy, and the server averages ``A``
and ``B`` separately (FedAvg of the factors, not of their products ``B A``: the average of products is not the
product of averages; FFA-LoRA, Sun et al. ICLR 2024, discusses the gap).

cfl's reading: LoRA on ``qkv`` only (not the output projection or the MLP), rank and alpha from ``model.lora_rank``
and ``model.lora_alpha``; one set of factors for every task (no per-task LoRA, no merging at task ends)."""

from __future__ import annotations

from typing import Any

from cfl.config.keys import Config
from cfl.config.schema import ConfigError
from cfl.methods.base import Method, Requires


class LoRA(Method):
    name = "lora"
    about = ("LoRA: low-rank factors of every attention qkv projection of a frozen pretrained ViT (Hu et al. 2022), "
             "FedAvg of the factors and head; model.train: lora")
    requires = Requires(model_train="lora")

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:  # noqa: ARG003
        if cfg.model.lora_tasks != "shared":
            raise ConfigError("method lora trains every factor at every task: model.lora_tasks: per-task would train "
                              "every task's factors together; set lora_tasks: shared, or use method pilora (each "
                              "task's own)")
