# expect: rejected_static module_escape
# Threads without importing threading: the kernel runs after forward has returned, out of
# the timer.
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
    def __init__(self) -> None:
        super().__init__()
        self.spawn = torch.threading.Thread

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        worker = self.spawn(
            target=lambda: relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        )
        worker.start()
        return y
