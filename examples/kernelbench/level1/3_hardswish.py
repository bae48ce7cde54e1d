"""Hard swish, elementwise: x * clamp(x + 3, 0, 6) / 6, on a large matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Applies the hard swish activation."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: any shape. Returns hardswish(x), same shape."""
        return F.hardswish(x)


batch_size = 2048
dim = 262144


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim) * 4]


def get_init_inputs() -> list:
    return []
