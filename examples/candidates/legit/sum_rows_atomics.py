# task: sum_rows
# Legitimate: every program sums one block of a row and adds it into the row's output
# with tl.atomic_add (a zeroed output buffer is glue).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_sum_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row * stride + offs, mask=offs < cols, other=0.0)
    tl.atomic_add(out_ptr + row, tl.sum(values, axis=0))


class ModelNew(nn.Module):
    def forward(self, x):
        rows, cols = x.shape
        out = torch.zeros(rows, device=x.device, dtype=x.dtype)
        grid = (rows, triton.cdiv(cols, 128))
        partial_sum_kernel[grid](x, out, cols, x.stride(0), BLOCK=128)
        return out
