"""Suffix sums along a dim: y[..., i] = sum of x[..., j] for j >= i (a cumulative sum
taken from the end). The row length is given as a one-element shape tuple."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Reverse cumulative sum along ``dim``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, *row_shape). Returns the suffix sums, same shape."""
        return x.flip(self.dim).cumsum(self.dim).flip(self.dim)


batch_size = 16384
row_shape = (24576,)
dim = 1


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, *row_shape)]


def get_init_inputs() -> list:
    return [dim]
