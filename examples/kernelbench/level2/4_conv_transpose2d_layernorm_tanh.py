"""A strided 2-D transposed convolution, layer norm over the last axis, tanh, scaling.

The LayerNorm is built for ``out_channels`` values and applied to the last axis of the
convolution's output, its width: the two agree only where out_channels is twice the
input's width (kernel 4, stride 2, padding 1 double it), as at these sizes.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    """tanh(layer_norm(conv_transpose2d(x))) * scale, the norm over the last axis."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        padding: int,
        scale: float,
    ) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding
        )
        self.norm = nn.LayerNorm(out_channels)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch_size, in_channels, H, W). Returns
        (batch_size, out_channels, 2 * H, 2 * W)."""
        return torch.tanh(self.norm(self.up(x))) * self.scale


batch_size = 32
in_channels = 64
out_channels = 128
H, W = 48, 64
kernel_size = 4
stride = 2
padding = 1
scale = 1.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, in_channels, H, W)]


def get_init_inputs() -> list:
    return [in_channels, out_channels, kernel_size, stride, padding, scale]
