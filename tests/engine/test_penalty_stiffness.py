"""A run stopped by a non-finite update names a quadratic penalty too stiff for its SGD steps (lr x weight above
2 (1 + momentum)), and says nothing of the kind when the penalty is not the cause."""

import pytest

from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server import NonFiniteError
from cfl.validation import from_dict
from tests.conftest import make_stream


def _run(**kw):
    base = {"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 4, "lr": 0.1,
            "local_epochs": 3, "wandb": {"mode": "disabled"}}
    Runner(from_dict({**base, **kw}), make_stream("task")).run()


def test_fedprox_weight_past_the_sgd_bound_is_named():
    # lr x mu = 0.1 x 1000 = 100 > 2: each step multiplies the distance to the anchor by |1 - 100|
    with pytest.raises(NonFiniteError) as err:
        _run(method={"name": "fedprox", "mu": 1000.0})
    message = str(err.value)
    assert "Likely cause: method fedprox's penalty has weight 1000 on parameter" in message
    assert ("here 100 > 2: lower the penalty's strength (method fedprox's parameters: mu) so that its weight "
            "stays below 20, or lower lr") in message


def test_momentum_raises_the_bound():
    # heavy ball: stable while lr x weight < 2 (1 + m); with m = 0.5 the bound is 3, lr x mu = 100 still above
    with pytest.raises(NonFiniteError, match=r"here 100 > 3: .* stays below 30, or lower lr"):
        _run(method={"name": "fedprox", "mu": 1000.0}, momentum=0.5)


def test_no_hint_when_the_penalty_is_not_the_cause():
    with pytest.raises(NonFiniteError) as err:  # lr alone diverges; lr x mu = 0.1 is below the bound
        _run(lr=1e30, method={"name": "fedprox", "mu": 1e-31})
    assert "Likely cause" not in str(err.value)
    with pytest.raises(NonFiniteError) as err:  # no penalty at all
        _run(lr=1e30)
    assert "Likely cause" not in str(err.value)
