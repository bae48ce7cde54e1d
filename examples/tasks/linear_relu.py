"""Fused linear layer + bias + ReLU: relu(x @ W.T + b) with nn.Linear parameters."""

import torch
import torch.nn as nn

batch_size = 20
in_features = 70
out_features = 45


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_features)]


def get_init_inputs() -> list:
    return [in_features, out_features]
