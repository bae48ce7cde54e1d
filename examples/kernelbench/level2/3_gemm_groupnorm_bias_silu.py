"""A linear layer, group normalisation of its outputs, a learnt bias, then SiLU."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """silu(group_norm(linear(x)) + bias)."""

    def __init__(
        self, in_features: int, out_features: int, num_groups: int, bias_shape: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)
        with torch.no_grad():  # an affine transform that is not the identity
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, in_features). Returns (batch_size, out_features)."""
        return F.silu(self.norm(self.linear(x)) + self.bias)


batch_size = 16384
in_features = 512
out_features = 2048
num_groups = 32
bias_shape = (out_features,)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_features)]


def get_init_inputs() -> list:
    return [in_features, out_features, num_groups, bias_shape]
