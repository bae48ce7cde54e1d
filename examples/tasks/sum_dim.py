"""Sum over one dimension of a 3-D tensor, keeping it (size 1): the dimension is a
constructor argument, so a kernel must handle whichever one it is given."""

import torch
import torch.nn as nn

batch_size = 6
dim1 = 40
dim2 = 72
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs() -> list:
    return [reduce_dim]
