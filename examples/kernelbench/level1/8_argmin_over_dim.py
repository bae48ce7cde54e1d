"""Index of the smallest value along the last dim of a 3-D tensor."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """argmin over ``dim`` (the first index where several are equal)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, dim1, dim2). Returns int64 indices, ``dim`` dropped."""
        return torch.argmin(x, dim=self.dim)


batch_size = 96
dim1 = 1024
dim2 = 4093
reduce_dim = 2


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs() -> list:
    return [reduce_dim]
