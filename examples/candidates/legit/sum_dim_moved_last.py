# task: sum_dim
# Legitimate: the reduced dimension is moved last with a permutation built in the call
# (a list made here and changed: glue), rows of 2-D tiles indexed with [:, None] and
# [None, :] in the kernel, and the output shape written into a list made from x.shape.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_tile_sum(tile, axis: tl.constexpr):
    return tl.sum(tile, axis=axis)


@triton.jit
def sum_last_kernel(x_ptr, out_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, cols, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        tile = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0)
        acc += _row_tile_sum(tile, 1)
    tl.store(out_ptr + r, acc, mask=r < rows)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        d = self.dim % input.dim()
        perm = list(range(input.dim()))
        perm.pop(d)
        perm.append(d)
        moved = input.permute(perm).contiguous()
        cols = moved.shape[-1]
        rows = moved.numel() // cols
        out_shape = list(input.shape)
        out_shape[d] = 1
        out = torch.empty(out_shape, device=input.device, dtype=input.dtype)
        sum_last_kernel[(triton.cdiv(rows, 16),)](moved, out, rows, cols, BLOCK_R=16, BLOCK_C=32)
        return out
