"""Triton solution for KernelBench level1/95_CrossEntropyLoss.py: one program per row
computes logsumexp(row) - row[target] (an online maximum and sum over blocks of the
row), then one program averages the rows' losses into the 0-dim result."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_loss_kernel(x_ptr, target_ptr, loss_ptr, n_classes, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * n_classes
    running_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_classes, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_classes, other=float("-inf"))
        new_max = tl.maximum(running_max, x)
        # A lane that has seen only padding keeps a zero sum (and computes no inf - inf).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * tl.exp(running_max - shift) + tl.exp(x - shift)
        running_max = new_max
    row_max = tl.max(running_max, axis=0)
    row_sum = tl.sum(running_sum * tl.exp(running_max - row_max), axis=0)
    target_logit = tl.load(x_row + tl.load(target_ptr + row))
    tl.store(loss_ptr + row, row_max + tl.log(row_sum) - target_logit)


@triton.jit
def mean_kernel(loss_ptr, out_ptr, n, BLOCK: tl.constexpr):
    total = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        total += tl.load(loss_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr, tl.sum(total, axis=0) / n)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        predictions = predictions.contiguous()
        rows, n_classes = predictions.shape
        losses = torch.empty(rows, dtype=predictions.dtype, device=predictions.device)
        row_loss_kernel[(rows,)](predictions, targets, losses, n_classes, BLOCK=1024)
        loss = torch.empty((), dtype=predictions.dtype, device=predictions.device)
        mean_kernel[(1,)](losses, loss, rows, BLOCK=1024)
        return loss
