"""Elementwise logistic sigmoid."""

import torch
import torch.nn as nn

batch_size = 8
dim = 900


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim) * 4]


def get_init_inputs() -> list:
    return []
