"""The contexts of the merged client hooks (cfl/methods/client_hooks.py) carry every argument the old hooks took,
and a class's declared parts must match its overrides, for each of the four hooks asked by part."""

import dataclasses
import re

import pytest

from cfl.config.schema import ConfigError
from cfl.methods.base import ClientRound, ClientRoundStart, Computes, Method, Step

#: old hook -> its arguments, each a field of the new context (``carry_step``'s ``moved``: ``Step.moved``)
OLD = {"penalty": (ClientRound, ("global_params", "server", "state")),
       "layer_preconditioner": (ClientRound, ("state",)), "gradient_projection": (ClientRound, ("state",)),
       "client_start": (ClientRoundStart, ("params", "state", "server", "task")),
       "local_steps_per_epoch": (ClientRoundStart, ("num_samples", "server")),
       "carry_start": (ClientRoundStart, ("global_params", "state")),
       "carry_step": (Step, ("moved",))}


@pytest.mark.parametrize("hook", sorted(OLD))
def test_a_context_carries_every_argument_of_the_old_hook(hook):
    ctx, args = OLD[hook]
    assert set(args) <= {f.name for f in dataclasses.fields(ctx)}
    assert not hasattr(Method, hook) or hook in ("client_start", "carry_step")


#: each hook asked by part: its declaration field, a part, a part that is not one, the parts
PART_HOOKS = [("round_terms", "terms", "penalty", "moves", "['penalty', 'preconditioner', 'projection']"),
              ("client_start", "starts", "carry", "moves", "['steps', 'params', 'carry']"),
              ("loss", "losses", "extra", "other", "['task', 'extra']"),
              ("samples", "draws", "step", "other", "['replay', 'step']")]


@pytest.mark.parametrize(("hook", "field", "part", "unknown", "known"), PART_HOOKS)
def test_declared_parts_must_match_the_override(hook, field, part, unknown, known):
    with pytest.raises(TypeError, match=rf"overrides {hook}, which the engine asks by part: declare the parts it "
                                        rf"gives, computes=Computes\({field}=\(\.\.\.\)\)"):
        type("Undeclared", (Method,), {hook: lambda _self, _ctx: None})
    with pytest.raises(TypeError, match=rf"declares computes=Computes\({field}=\['{part}'\]\) but does not override "
                                        rf"{hook}"):
        type("Unused", (Method,), {"computes": Computes(**{field: (part,)})})
    with pytest.raises(TypeError, match=rf"Computes.{field} names the part\(s\) \['{unknown}'\]; they are "
                                        + re.escape(known)):
        Computes(**{field: (unknown,)})
    with pytest.raises(TypeError, match="lists a part twice"):
        Computes(**{field: (part, part)})
    with pytest.raises(ConfigError, match=rf"{field} -> computes=Computes\({field}=...\)"):
        type("Plain", (Method,), {field: (part,), hook: lambda _self, _ctx: None})
    ok = type("Ok", (Method,), {"computes": Computes(**{field: (part,)}), hook: lambda _self, _ctx: None})
    assert getattr(ok.computes, field) == (part,)
