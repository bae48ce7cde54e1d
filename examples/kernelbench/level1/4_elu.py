"""ELU with a non-default alpha, elementwise, on a large matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Applies ELU: x where x > 0, alpha * (exp(x) - 1) elsewhere."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: any shape. Returns elu(x), same shape."""
        return F.elu(x, alpha=self.alpha)


batch_size = 8192
dim = 98304
alpha = 0.7


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim)]


def get_init_inputs() -> list:
    return [alpha]
