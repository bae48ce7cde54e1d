"""Log-softmax over each row (dim=1)."""

import torch
import torch.nn as nn

batch_size = 8
dim = 500


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, dim) * 3]


def get_init_inputs() -> list:
    return []
