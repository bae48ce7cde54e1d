# task: matmul
# Legitimate: split-K: each program multiplies one K slice of a tile and accumulates into
# a zeroed output with tl.atomic_add, in full fp32 precision.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def split_k_kernel(a_ptr, b_ptr, c_ptr, M, N, K, K_PER: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    k_start = tl.program_id(2) * K_PER
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K_PER, BK):
        rk = k_start + k0 + tl.arange(0, BK)
        a_mask = (rm[:, None] < M) & (rk[None, :] < K)
        b_mask = (rk[:, None] < K) & (rn[None, :] < N)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=a_mask, other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=b_mask, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.atomic_add(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=c_mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        a = a.contiguous()
        b = b.contiguous()
        M, K = a.shape
        N = b.shape[1]
        c = torch.zeros((M, N), device=a.device, dtype=a.dtype)
        splits = 3
        k_per = triton.cdiv(triton.cdiv(K, splits), 16) * 16
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32), triton.cdiv(K, k_per))
        split_k_kernel[grid](a, b, c, M, N, K, K_PER=k_per, BM=32, BN=32, BK=16)
        return c
