"""Elementwise leaky ReLU with a negative slope given at construction."""

import torch
import torch.nn as nn

batch_size = 8
dim = 900
negative_slope = 0.1


class Model(nn.Module):
    def __init__(self, negative_slope: float) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.leaky_relu(x, self.negative_slope)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return [negative_slope]
