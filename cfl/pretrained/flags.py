"""How a run's method is flagged where its backbone is not what its name suggests: appended to the method in
results.json and to every table row, figure legend and W&B name (cfl.pretrained.features, cfl.report.labels,
cfl.report.wandb_names), so that its numbers never pass for an ImageNet backbone's. No imports: the report reads
it without loading a backbone."""

from __future__ import annotations

#: an untrained backbone (``weights: random``, or a file flagged as freshly initialised)
RANDOM_SUFFIX = " (random backbone)"


def origin_suffix(origin: str | None) -> str:
    """The suffix of a weights file given ``model.weights_origin`` (``" (in-house backbone, not ImageNet)"``;
    "" for none)."""
    return f" ({origin})" if origin else ""
