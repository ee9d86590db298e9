"""FedAvg (McMahan et al., AISTATS 2017): plain local SGD, sample-weighted averaging on the server."""

from __future__ import annotations

from cfl.methods.base import Method


class FedAvg(Method):
    name = "fedavg"
    about = "FedAvg: local SGD, sample-weighted mean of client updates (the 'FL' baseline)"
