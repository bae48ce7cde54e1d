"""2-D convolution, 5 x 5 kernel, padded to keep the spatial size, with a bias, on a
non-square input."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Conv2d with ``padding = kernel_size // 2``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, in_channels, height, width). Returns
        (batch_size, out_channels, height, width)."""
        return self.conv(x)


batch_size = 8
in_channels = 12
out_channels = 96
kernel_size = 5
height = 384
width = 512


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs() -> list:
    return [in_channels, out_channels, kernel_size]
