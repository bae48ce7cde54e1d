"""Convolution, then a learnt per-channel bias, then leaky ReLU."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """leaky_relu(conv2d(x) + bias), the bias one value per output channel."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        bias_shape: tuple[int, ...],
        negative_slope: float,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, in_channels, height, width). Returns
        (batch_size, out_channels, height - kernel_size + 1, width - kernel_size + 1)."""
        return F.leaky_relu(self.conv(x) + self.bias, self.negative_slope)


batch_size = 64
in_channels = 32
out_channels = 64
height = width = 96
kernel_size = 3
bias_shape = (out_channels, 1, 1)
negative_slope = 0.05


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs() -> list:
    return [in_channels, out_channels, kernel_size, bias_shape, negative_slope]
