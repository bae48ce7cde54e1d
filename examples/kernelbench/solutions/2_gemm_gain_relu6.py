"""Triton solution for level2/2_gemm_gain_relu6.py: clamp((x @ W^T) * gain, 0, 6) in one
kernel: 32 x 32 output tiles of tl.dot at full fp32 precision (W^T read through W's
strides), the per-feature gain and the clamp applied before the store."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gemm_gain_relu6_kernel(
    x_ptr, w_ptr, gain_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x_mask = (rm[:, None] < M) & (rk[None, :] < K)
        w_mask = (rk[:, None] < K) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :] * sxk, mask=x_mask, other=0.0)
        w = tl.load(w_ptr + rk[:, None] * swk + rn[None, :] * swn, mask=w_mask, other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    acc *= tl.load(gain_ptr + rn, mask=rn < N, other=0.0)[None, :]
    acc = tl.minimum(tl.maximum(acc, 0.0), 6.0)
    y_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc, mask=y_mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, gain_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.gain = nn.Parameter(torch.rand(gain_shape) * 4 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.gemm.weight
        M, K = x.shape
        N = weight.shape[0]
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        gemm_gain_relu6_kernel[grid](
            x, weight, self.gain.contiguous(), y, M, N, K, x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), y.stride(0), y.stride(1), BM=32, BN=32, BK=32,
        )  # fmt: skip
        return y
