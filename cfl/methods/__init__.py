"""Method registry: one line per method. See docs/plugins.md to add your own."""

from __future__ import annotations

from cfl.methods.afcl import AFCL
from cfl.methods.agem import AGEM
from cfl.methods.base import Method
from cfl.methods.codap import CodaP
from cfl.methods.derpp import DERpp
from cfl.methods.dualprompt import DualPrompt
from cfl.methods.er import ER
from cfl.methods.ewc import EWC
from cfl.methods.fedadam import FedAdam
from cfl.methods.fedavg import FedAvg
from cfl.methods.fedcprompt import FedCPrompt
from cfl.methods.fedcurv import FedCurv
from cfl.methods.feddyn import FedDyn
from cfl.methods.fedicarl import FediCaRL
from cfl.methods.fedlwf import FedLwF
from cfl.methods.fedncm import FedNCM
from cfl.methods.fedprox import FedProx
from cfl.methods.fedweit import FedWeIT
from cfl.methods.fedyogi import FedYogi
from cfl.methods.flwf2t import FLwF2T
from cfl.methods.fot import FOT
from cfl.methods.gem import GEM
from cfl.methods.glfc import GLFC
from cfl.methods.gpm import GPM
from cfl.methods.l2p import L2P
from cfl.methods.lora import LoRA
from cfl.methods.lorm import LoRM
from cfl.methods.mas import MAS
from cfl.methods.mfcl import MFCL
from cfl.methods.pilora import PILoRA
from cfl.methods.powder import Powder
from cfl.methods.ranpac import RanPAC
from cfl.methods.rgo import RGO
from cfl.methods.scaffold import Scaffold
from cfl.methods.si import SI
from cfl.methods.target import Target
from cfl.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")


def register(cls: type[Method]) -> type[Method]:
    """Register a method class under its own ``name`` (a user's plugin: ``@register``); a name already
    registered is refused, unless by the same class defined again (same module and qualified name: a re-run
    notebook cell, an edited plugin file), which replaces it with a warning (docs/python-api.md)."""
    return METHODS.register(cls.name, cls, about=cls.about)


register(FedAvg)
register(FedProx)
register(FedCurv)
register(FedAdam)
register(FedYogi)
register(EWC)
register(MAS)
register(SI)
register(ER)
register(AGEM)
register(GEM)
register(GLFC)
register(FedLwF)
register(FLwF2T)
register(FOT)  # eps per stream: PMNIST 0.96 IID / 0.94 non-IID; CIFAR-100 0.87 (+0.001/task);
register(GPM)  # 5-Datasets 0.95 (+0.001); Mini-ImageNet 0.90 (+0.001) -- same values for gpm
register(RGO)
register(FedWeIT)
register(Target)  # class-incremental, a model with BatchNorm running statistics
register(MFCL)
register(FedNCM)  # on a pretrained backbone's cached features (docs/pretrained.md)
register(AFCL)
register(RanPAC)  # a ridge regression on a fixed random projection ReLU(x W_rand) of the features
register(L2P)  # model.train: prompts on a pretrained backbone
register(CodaP)  # model.train: components on a pretrained backbone
register(DualPrompt)  # model.train: dual-prompts (attention prefixes) on a pretrained backbone
register(FedCPrompt)  # model.train: components, task-specific, with the contrastive continual loss
register(LoRA)  # model.train: lora on a pretrained backbone
register(LoRM)  # model.train: lora; closed-form (RegMean) merge of the trained factor
register(PILoRA)  # model.train: lora, per-task factors and a prototype classifier
register(Powder)  # model.train: task-components, composed by the task correlation; task-incremental
register(Scaffold)  # option II control variates; on the stacked path (a Linear penalty)
register(FedDyn)
register(DERpp)  # reservoir per step in the step hooks' carry: the vmap path
register(FediCaRL)  # class-incremental: herding exemplars, iCaRL's sigmoid/BCE distillation (loss, task)
