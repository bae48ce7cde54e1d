# task: linear_relu
# Legitimate: the layout the kernel wants (the weight transposed, contiguous) is made from
# the parameters on the first call and kept; the module moves to the inputs' device if it
# must. Neither value holds anything of a call's inputs.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_relu_kernel(
    x_ptr, wt_ptr, b_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(
            x_ptr + rm[:, None] * K + rk[None, :],
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            wt_ptr + rk[:, None] * N + rn[None, :],
            mask=(rk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision="ieee")
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], tl.maximum(acc, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.weight_t = None

    def forward(self, x):
        if self.linear.weight.device != x.device:
            self.linear = self.linear.to(x.device)
        if self.weight_t is None:
            self.weight_t = self.linear.weight.t().contiguous()
        x = x.contiguous()
        M, K = x.shape
        N = self.weight_t.shape[1]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        linear_relu_kernel[grid](
            x, self.weight_t, self.linear.bias, y, M, N, K, BM=16, BN=16, BK=16
        )
        return y
