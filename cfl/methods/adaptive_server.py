"""Adaptive server optimisers on the pseudo-gradient (Reddi et al., ICLR 2021, arXiv 2003.00295, Algorithm 2).

The aggregated client update ``D`` (the negative pseudo-gradient) drives Adam-style server moments:
``m <- b1 m + (1 - b1) D``, a method-specific second moment ``v``, and ``w <- w + eta_g m / (sqrt(v) + tau)``
(no bias correction, ``v`` starts at ``tau^2`` as in the paper's ``v_{-1} >= tau^2``). FedAdam and FedYogi
differ only in ``v`` (:meth:`AdaptiveServer.second_moment`). With ``aggregator: gma`` the runner feeds
the unmasked mean into these moments and multiplies the resulting step by the mask (GMA paper, Alg. 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import Method, Requires, ServerUpdate
from cfl.methods.bounds import LR_MAX
from cfl.tensors import Params


@dataclass(frozen=True)
class AdaptiveServerHyperparams:
    server_lr: float = field(0.01, "eta_g of the adaptive step (Reddi et al. tune it in 1e-3..1; the top-level "
                             "server_lr is not used by adaptive servers)", gt=0.0, max=LR_MAX)
    beta1: float = field(0.9, "decay of the first moment m", min=0.0, max=0.9999)
    beta2: float = field(0.99, "decay of the second moment v", min=0.0, max=0.9999)
    tau: float = field(1e-3, "adaptivity: added to sqrt(v) in the step's denominator (Reddi et al. tune it in "
                       "1e-10..1e-1; at most 1, beyond which the step is plain SGD at server_lr / tau)",
                       gt=0.0, max=1.0)


class AdaptiveServer(Method):
    """Shared server step of FedAdam and FedYogi; subclasses define the second moment."""

    Hyperparams = AdaptiveServerHyperparams
    requires = Requires(unread_keys={"server_lr": "its adaptive step uses the method's own server_lr; set it instead"})

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # abstract

    def server_update(self, ctx: ServerUpdate) -> Params:
        lr, global_params, delta, server = self.hparams.server_lr, ctx.global_params, ctx.delta, ctx.server
        if "m" not in server:
            server["m"] = {k: torch.zeros_like(d) for k, d in delta.items()}
            server["v"] = {k: torch.full_like(d, self.hparams.tau**2) for k, d in delta.items()}
        new = {}
        for k, d in delta.items():
            m = server["m"][k] = self.hparams.beta1 * server["m"][k] + (1.0 - self.hparams.beta1) * d
            v = server["v"][k] = self.second_moment(server["v"][k], d * d)
            new[k] = global_params[k] + lr * m / (v.sqrt() + self.hparams.tau)
        return new
