"""Softmax of each row at a temperature, over rows far longer than one block."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """softmax(x / temperature) along the last dim."""

    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, dim). Returns the row-wise softmax, same shape."""
        return torch.softmax(x / self.temperature, dim=-1)


batch_size = 1024
dim = 524288
temperature = 2.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim) * 3]


def get_init_inputs() -> list:
    return [temperature]
