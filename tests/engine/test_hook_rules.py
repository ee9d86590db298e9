
"""Each hook's rule (cfl/engine/hook_rules.py) refuses what breaks it, names the method, its file and the hook,
and lets every built-in method's hooks through; the dry call before a run leaves torch's generator as it was."""

import pytest
import torch

from cfl.engine.hook_rules import check_params, check_penalty, check_projection, check_replay, check_upload
from cfl.engine.local import hooks
from cfl.engine.rounds.preflight import dry_run_hooks
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method, Quadratic, Samples
from cfl.methods.hook_guard import HookError, guarded
from cfl.plugin import Computes, LossTerms
from tests.conftest import method_spec, stream_for, tiny_config

PARAMS = {"w": torch.zeros(3, 4), "b": torch.zeros(3)}


class Plugin(Method):
    name = "plugin"
    computes = Computes(losses=("extra",))

    def loss(self, ctx):
        x = ctx.x
        return LossTerms(extra=x.sum(1, keepdim=True))  # (B, 1): one dim too many


BAD = [  # (check, its arguments, words of the message)
    (check_penalty, ([1.0], PARAMS), ["Quadratic(weight, anchor)", "got list"]),
    (check_penalty, ({"v": Quadratic(1.0, torch.zeros(3))}, PARAMS), ["'v' is not a parameter", "w, b"]),
    (check_penalty, ({"b": (1.0, torch.zeros(3))}, PARAMS), ["for 'b' got tuple"]),
    (check_penalty, ({"b": Quadratic(1.0, torch.zeros(4))}, PARAMS), ["anchor of 'b' (shape (3,))", "shape (4,)"]),
    (check_penalty, ({"w": Quadratic(torch.ones(3, 4, 1), torch.zeros(3, 4))}, PARAMS), ["broadcasts to (3, 4)"]),
    (check_penalty, ({"b": Quadratic("1", torch.zeros(3))}, PARAMS), ["weight of 'b'", "got str"]),
    (check_projection, ([1.0], PARAMS), ["basis (d, k)", "got list"]),
    (check_projection, ({"w": torch.zeros(3, 2)}, PARAMS), ["for 'w' (d = 4)", "shape (3, 2)"]),
    (check_replay, (Samples(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)),
                    torch.zeros(9, 4)), ["x must be of shape (n, 4)"]),
    (check_replay, (Samples(torch.zeros(2, 4), torch.zeros(2), torch.zeros(2, dtype=torch.long)),
                    torch.zeros(9, 4)), ["y must be an integer vector of 2"]),
    (check_upload, ([1],), ["upload, a dict", "got list"]),
    (check_params, ({"w": torch.zeros(3, 4)}, PARAMS, "rule"), ["rule; got dict without b"]),
    (check_params, ({"w": torch.zeros(3, 4), "b": torch.zeros(1)}, PARAMS, "rule"), ["for 'b' (shape (3,))"]),
]


@pytest.mark.parametrize(("check", "args", "words"), BAD, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_a_broken_rule_is_named_at_its_hook(check, args, words):
    with pytest.raises(HookError) as caught, guarded(Plugin(None, None), "the_hook"):
        check(*args)
    message = str(caught.value)
    assert message.startswith(f"method 'plugin' (Plugin in {__file__}), hook the_hook: "), message
    for word in words:
        assert word in message, message


def test_a_wrong_result_under_vmap_is_named_at_its_hook():
    method = Plugin(None, None)
    with pytest.raises(HookError, match=r"hook loss: must return LossTerms\(extra=\) one float loss per sample .* "
                                        r"\(here 5\); got "
                                        r"a torch.float32 tensor of shape \(5, 1\)"):
        torch.func.vmap(lambda x: hooks.extra_loss(method, {}, x, x[:, 0], x[:, 0], {}, {}))(torch.ones(2, 5, 3))


def test_ctrl_c_in_a_hook_stays_ctrl_c():
    with pytest.raises(KeyboardInterrupt), guarded(Plugin(None, None), "round_terms"):
        raise KeyboardInterrupt


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_built_in_method_passes_the_dry_call_and_the_generator_is_left_as_it_was(name):
    runner = Runner(tiny_config(method=method_spec(name)), stream_for(name))
    before = torch.random.get_rng_state()
    dry_run_hooks(runner)
    assert torch.equal(torch.random.get_rng_state(), before)
