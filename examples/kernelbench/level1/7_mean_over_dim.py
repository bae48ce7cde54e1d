"""Mean over one dim of a 3-D tensor; the dim is a constant, given at construction."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Averages the input over ``dim``, which it drops."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, dim1, dim2). Returns x.mean(dim), one dim fewer."""
        return torch.mean(x, dim=self.dim)


batch_size = 64
dim1 = 2048
dim2 = 3000
reduce_dim = 1


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs() -> list:
    return [reduce_dim]
