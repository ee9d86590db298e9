"""FedAdam (Reddi et al., ICLR 2021): Adam on the server, ``v <- b2 v + (1 - b2) D^2``."""

from __future__ import annotations

import torch

from cfl.methods.adaptive_server import AdaptiveServer


class FedAdam(AdaptiveServer):
    name = "fedadam"
    about = "FedAdam: Adam server optimiser on the averaged client update (server_lr, beta1, beta2, tau)"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return self.hparams.beta2 * v + (1.0 - self.hparams.beta2) * d2
