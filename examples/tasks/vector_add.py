"""Elementwise a + b of two (batch, dim) tensors."""

import torch
import torch.nn as nn

batch_size = 8
dim = 777


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pass

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []
