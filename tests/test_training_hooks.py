"""The training hooks' contexts (cfl/methods/training_hooks.py): each carries every argument the old hooks took
(task_loss, extra_loss, replay, step_samples, client_end), the declared parts are checked at class creation, and a
result with a part the class does not declare breaks the hook's rule."""

import dataclasses

import pytest
import torch

from cfl.engine import hooks
from cfl.methods.hook_guard import HookError
from cfl.plugin import ClientEndContext, Computes, Draw, LossContext, LossTerms, Method, Samples, SamplesContext
from cfl.schema import ConfigError

OLD = {
    LossContext: {"params", "logits", "y", "x", "task", "weight", "allowed", "server", "state", "samples"},
    SamplesContext: {"state", "generator", "server", "carry"},
    ClientEndContext: {"event", "model", "params", "data", "state", "server", "generator", "training"},
}


@pytest.mark.parametrize("context", list(OLD))
def test_a_context_carries_every_old_argument(context):
    assert OLD[context] <= {f.name for f in dataclasses.fields(context)}


def test_the_parts_are_declared_and_checked_at_class_creation():
    with pytest.raises(TypeError, match=r"overrides loss, which the engine asks by part: declare the parts it gives, "
                                        r"computes=Computes\(losses=\(\.\.\.\)\)"):
        type("NoParts", (Method,), {"loss": lambda _self, _ctx: None})
    with pytest.raises(TypeError, match=r"declares computes=Computes\(draws=\['step'\]\) but does not override "
                                        r"samples"):
        type("NoHook", (Method,), {"computes": Computes(draws=("step",))})
    with pytest.raises(TypeError, match=r"Computes.losses names the part\(s\) \['other'\]; they are "
                                        r"\['task', 'extra'\]"):
        Computes(losses=("other",))
    with pytest.raises(TypeError, match="lists a part twice"):
        Computes(draws=("step", "step"))
    with pytest.raises(ConfigError, match=r"draws -> computes=Computes\(draws=...\)"):
        type("Plain", (Method,), {"draws": ("step",), "samples": lambda _self, _ctx: None})


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
