"""The training hooks' contexts (cfl/methods/training_hooks.py): each carries every argument the old hooks took
(task_loss, extra_loss, replay, step_samples, client_end), and a result with a part the class does not declare
breaks the hook's rule (the declarations themselves: tests/methods/test_client_hooks.py)."""

import dataclasses

import pytest
import torch

from cfl.engine.local import hooks
from cfl.methods.hook_guard import HookError
from cfl.plugin import ClientEndContext, Computes, Draw, LossContext, LossTerms, Method, Samples, SamplesContext

OLD = {
    LossContext: {"params", "logits", "y", "x", "task", "weight", "allowed", "server", "state", "samples"},
    SamplesContext: {"state", "generator", "server", "carry"},
    ClientEndContext: {"event", "model", "params", "data", "state", "server", "generator", "training"},
}


@pytest.mark.parametrize("context", list(OLD))
def test_a_context_carries_every_old_argument(context):
    assert OLD[context] <= {f.name for f in dataclasses.fields(context)}


class Both(Method):
    name = "both"
    computes = Computes(losses=("extra",), draws=("replay",))

    def loss(self, ctx):
        return LossTerms(extra=ctx.x.sum(1), task=ctx.x.sum(1))

    def samples(self, ctx):
        return Draw(step=Samples(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)))


def test_a_part_not_declared_breaks_the_rule():
    m, x = Both(None, None), torch.ones(4, 3)
    with pytest.raises(HookError, match=r"hook loss: must return only the part asked for .* LossTerms.task at a call "
                                        r"for part 'extra', which its class does not declare"):
        hooks.extra_loss(m, {}, x, x[:, 0].long(), torch.ones(4), {}, {})
    with pytest.raises(HookError, match=r"hook samples: must return only the part asked for .* Draw.step"):
        hooks.replayed(m, {}, torch.Generator(), x, {})
