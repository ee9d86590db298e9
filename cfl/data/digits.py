"""scikit-learn's bundled 8x8 handwritten digits (1,797 images): the offline, embedded default."""

from __future__ import annotations

import torch

DIGITS_TEST_FRACTION = 0.2


def load_digits_tensors() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Stratified 80/20 split (fixed, independent of the run seed), standardised with train stats."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=DIGITS_TEST_FRACTION, stratify=digits.target, random_state=0
    )
    x_train = torch.tensor(x_train, dtype=torch.float32).view(-1, 1, 8, 8)
    x_test = torch.tensor(x_test, dtype=torch.float32).view(-1, 1, 8, 8)
    mean, std = x_train.mean(), x_train.std()
    return ((x_train - mean) / std, torch.tensor(y_train)), ((x_test - mean) / std, torch.tensor(y_test))
