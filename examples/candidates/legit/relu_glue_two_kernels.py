# task: relu
# Legitimate: flatten/view glue, a helper that launches, and two kernels per forward.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def relu_inplace_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.where(v > 0, v, 0.0), mask=mask)


def launch(flat: torch.Tensor) -> torch.Tensor:
    n = flat.numel()
    out = torch.empty(n, dtype=flat.dtype, device=flat.device)
    grid = (triton.cdiv(n, 512),)
    copy_kernel[grid](flat, out, n, BLOCK=512)
    relu_inplace_kernel[grid](out, n, BLOCK=512)
    return out


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.contiguous().reshape(-1)
        return launch(flat).view(x.shape)
