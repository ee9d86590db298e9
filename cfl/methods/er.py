"""ER+FL: experience replay (Chaudhry et al., "On Tiny Episodic Memories in Continual Learning", 2019,
arXiv 1902.10486) on each client, with a memory of its own samples from earlier tasks
(:class:`~cfl.methods.episodic_memory.EpisodicMemory`: balanced over tasks and classes, refilled at task ends).
Each local step adds ``replay_batch_size`` memory samples (drawn without replacement from the client's own
generator) to the current batch; each carries its task id, so task-incremental samples use their own head.
Nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cfl.config.schema import field
from cfl.methods.base import Computes, Draw, SamplesContext
from cfl.methods.bounds import SAMPLES_MAX
from cfl.methods.episodic_memory import EpisodicMemory


@dataclass(frozen=True)
class ERHyperparams:
    mem_per_client: int = field(100, "replay memory slots per client (all earlier tasks together)",
                                min=1, max=SAMPLES_MAX)
    replay_batch_size: Optional[int] = field(None, "memory samples added to each local step (null: the run's "
                                             "batch_size, as in Chaudhry et al. 2019)", min=1, max=SAMPLES_MAX)


class ER(EpisodicMemory):
    name = "er"
    about = "ER+FL: each client replays a balanced memory of its own earlier-task samples"
    Hyperparams = ERHyperparams
    computes = Computes(draws=("replay",))

    def samples(self, ctx: SamplesContext) -> Draw | None:
        state, generator = ctx.state, ctx.generator
        return Draw(replay=self.draw(state, generator, self.hparams.replay_batch_size or self.run_info.batch_size))
