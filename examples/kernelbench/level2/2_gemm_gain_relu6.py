"""A linear layer without bias, a learnt gain per output feature, then ReLU6."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """clamp((x @ W^T) * gain, 0, 6)."""

    def __init__(self, in_features: int, out_features: int, gain_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.gain = nn.Parameter(torch.rand(gain_shape) * 4 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, in_features). Returns (batch_size, out_features)."""
        return torch.clamp(self.gemm(x) * self.gain, min=0.0, max=6.0)


batch_size = 2048
in_features = 4096
out_features = 6144
gain_shape = (out_features,)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_features)]


def get_init_inputs() -> list:
    return [in_features, out_features, gain_shape]
