"""The contexts of the merged client hooks (cfl/methods/client_hooks.py) carry every argument the old hooks took,
and a class's declared parts must match its overrides."""

import dataclasses

import pytest

from cfl.methods.base import ClientRound, ClientRoundStart, Computes, Method, RoundTerms, Step
from cfl.schema import ConfigError

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


def test_declared_parts_must_match_the_override():
    with pytest.raises(TypeError, match=r"overrides round_terms, which the engine asks by part: declare the parts it "
                                        r"gives, computes=Computes\(terms=\(\.\.\.\)\)"):
        type("Undeclared", (Method,), {"round_terms": lambda _self, _ctx: RoundTerms()})
    with pytest.raises(TypeError, match=r"declares computes=Computes\(starts=\['carry'\]\) but does not override "
                                        r"client_start"):
        type("Unused", (Method,), {"computes": Computes(starts=("carry",))})
    with pytest.raises(TypeError, match=r"Computes.starts names the part\(s\) \['moves'\]; they are "
                                        r"\['steps', 'params', 'carry'\]"):
        Computes(starts=("moves",))
    with pytest.raises(ConfigError, match=r"terms -> computes=Computes\(terms=...\)"):
        type("Plain", (Method,), {"terms": ("penalty",), "round_terms": lambda _self, _ctx: None})
    ok = type("Ok", (Method,), {"computes": Computes(terms=("penalty",)), "round_terms": lambda _self, _ctx: None})
    assert ok.computes.terms == ("penalty",)
