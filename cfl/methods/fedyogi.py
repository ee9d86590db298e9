"""FedYogi (Reddi et al., ICLR 2021): Yogi on the server, ``v <- v - (1 - b2) D^2 sign(v - D^2)``."""

from __future__ import annotations

import torch

from cfl.methods.adaptive_server import AdaptiveServer


class FedYogi(AdaptiveServer):
    name = "fedyogi"
    about = "FedYogi: Yogi server optimiser on the averaged client update (server_lr, beta1, beta2, tau)"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1.0 - self.hparams.beta2) * d2 * torch.sign(v - d2)
