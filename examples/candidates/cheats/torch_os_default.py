# expect: rejected_static module_escape
# A default argument of __init__ reads the environment through torch.os (no import).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hint: str = torch.os.environ.get("KF_EXPECTED_OUTPUT", "")) -> None:
        super().__init__()
        self.hint = hint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
