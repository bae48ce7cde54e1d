# expect: rejected_static callback
# A heuristic (run by Triton before each launch) computes the output with PyTorch.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.heuristics({"DONE": lambda args: args["y_ptr"].copy_(torch.relu(args["x_ptr"])) is None})
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, DONE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if not DONE:
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
