"""Sum over dim=1 of a (batch, dim) tensor: a row reduction with a (batch,) output.

``dim`` is not a multiple of a power-of-two block, so a kernel that loops over column
blocks must mask the last one.
"""

import torch
import torch.nn as nn

batch_size = 16
dim = 1000


class Model(nn.Module):
    """y[i] = sum_j x[i, j]."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []
