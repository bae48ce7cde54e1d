"""Batched product of queries with transposed keys: scores[b] = Q[b] @ K[b]^T, as an
attention layer computes them (without the scaling)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Query-key scores for every batch entry."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """queries: (batch_size, q_len, head_dim); keys: (batch_size, k_len, head_dim).
        Returns (batch_size, q_len, k_len)."""
        return torch.matmul(queries, keys.transpose(1, 2))


batch_size = 32 * 2
q_len = 256 * 2
k_len = 384 * 2
head_dim = 64 * 2


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(batch_size, q_len, head_dim), torch.randn(batch_size, k_len, head_dim)]


def get_init_inputs() -> list:
    return []
