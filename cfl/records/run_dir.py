"""What a run directory holds, as the engine writes it and the reports read it: the checkpoint's file name, and
the config keys a resumed run may change (they never alter what the run computes, so two runs that differ only
there are the same experiment)."""

from __future__ import annotations

CHECKPOINT = "checkpoint.pt"
# Keys a resumed run may change: they never alter what the run computes (threads may alter the last bits
# of some CPU kernels; keep it fixed when a bit-identical result matters).
RESUME_SAFE_KEYS = ("threads", "checkpoint_every", "on_nonfinite", "data_root", "wandb", "client_state_store",
                    "keep_client_states", "label")


def is_resume_safe(key: str) -> bool:
    """Whether the dotted config ``key`` (or a key under it) is one a resumed run may change."""
    return any(key == safe or key.startswith(f"{safe}.") for safe in RESUME_SAFE_KEYS)
