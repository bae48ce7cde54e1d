"""Plain matrix multiply C = A @ B with sizes that are not multiples of a block."""

import torch
import torch.nn as nn

M = 45
K = 70
N = 53


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pass

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list:
    return []
