"""Mean over dim=0 of a (batch, dim) tensor: a column reduction."""

import torch
import torch.nn as nn

batch_size = 37
dim = 250


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=0)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []
