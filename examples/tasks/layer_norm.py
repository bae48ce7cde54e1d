"""LayerNorm over the last dim with learned weight and bias (nn.LayerNorm)."""

import torch
import torch.nn as nn

batch_size = 8
dim = 300


class Model(nn.Module):
    def __init__(self, normalized: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(normalized)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim) * 2 + 1]


def get_init_inputs() -> list:
    return [dim]
