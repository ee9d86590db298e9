import pytest

from cfl.metrics.matrix import average_accuracy, backward_transfer, forgetting, rounds_to_targets

MATRIX = [
    [90.0, None, None],
    [80.0, 70.0, None],
    [60.0, 65.0, 95.0],
]


def test_acc_is_mean_of_last_row():
    assert average_accuracy(MATRIX) == pytest.approx((60 + 65 + 95) / 3)


def test_fgt_is_mean_drop_from_diagonal():
    # (90 - 60) and (70 - 65) over the T-1 = 2 earlier tasks
    assert forgetting(MATRIX) == pytest.approx((30 + 5) / 2)
    assert backward_transfer(MATRIX) == pytest.approx(-17.5)


def test_metrics_after_an_intermediate_task():
    assert average_accuracy(MATRIX, after=1) == pytest.approx(75.0)
    assert forgetting(MATRIX, after=1) == pytest.approx(10.0)
    assert forgetting(MATRIX, after=0) == 0.0


def test_rounds_to_targets():
    curve = [(5, 40.0), (10, 86.0), (15, 91.0), (20, 89.0)]
    assert rounds_to_targets(curve, [85, 90, 95]) == {"85": 10, "90": 15, "95": None}
