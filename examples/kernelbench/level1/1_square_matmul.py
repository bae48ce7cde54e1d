"""Square matrix product: C = A @ B, with the size written as an expression."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Multiplies two square matrices."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """A and B: (N, N). Returns their product, (N, N)."""
        return A @ B


N = 1024 * 4


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs() -> list:
    return []
