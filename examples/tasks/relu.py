"""Elementwise ReLU on a (batch, dim) tensor: the simplest memory-bound kernel.

``dim`` is deliberately not a multiple of a power-of-two block size, so a kernel that
forgets the tail block or its mask fails the verifier.
"""

import torch
import torch.nn as nn

batch_size = 16
dim = 1000


class Model(nn.Module):
    """y = max(x, 0)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return []
