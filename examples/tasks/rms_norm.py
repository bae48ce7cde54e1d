"""RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight."""

import torch
import torch.nn as nn

batch_size = 8
dim = 300


class Model(nn.Module):
    def __init__(self, normalized: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(normalized) + 0.5)
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return [dim]
