"""RMS normalisation over each sample's (channels, height, width) values, with a learnt
scale of that shape."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the mean over the normalised shape."""

    def __init__(self, normalized_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(normalized_shape, eps=1e-6)
        with torch.no_grad():  # a scale that is not all ones
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, channels, height, width). Returns the same shape."""
        return self.norm(x)


batch_size = 32
channels = 48
height = 128
width = 160


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, channels, height, width) + 0.5]


def get_init_inputs() -> list:
    return [(channels, height, width)]
