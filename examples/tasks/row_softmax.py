"""Softmax over each row (dim=1) of a (batch, dim) tensor.

A row fits in one block, but ``dim`` is not a power of two: the padded lanes must not
contribute to the row's max or to its normaliser.
"""

import torch
import torch.nn as nn

batch_size = 16
dim = 1000


class Model(nn.Module):
    """y[i, :] = softmax(x[i, :])."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []
