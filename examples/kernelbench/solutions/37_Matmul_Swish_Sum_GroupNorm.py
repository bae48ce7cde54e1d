"""Triton solution for KernelBench level2/37_Matmul_Swish_Sum_GroupNorm.py: one kernel
computes swish(x @ W.T + b) + bias in 32 x 32 tiles of tl.dot (full fp32 precision),
a second normalises each row's groups (one program per row, a groups x members tile) as
nn.GroupNorm does."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_swish_bias_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
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
    in_range = rn < N
    acc += tl.load(b_ptr + rn, mask=in_range, other=0.0)[None, :]
    acc = acc * tl.sigmoid(acc) + tl.load(bias_ptr + rn, mask=in_range, other=0.0)[None, :]
    y_mask = (rm[:, None] < M) & in_range[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=y_mask)


@triton.jit
def group_norm_kernel(
    y_ptr,
    gamma_ptr,
    beta_ptr,
    out_ptr,
    N,
    groups,
    group_size,
    eps,
    BG: tl.constexpr,
    BS: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.arange(0, BG)[:, None]
    member = tl.arange(0, BS)[None, :]
    cols = group * group_size + member
    mask = (group < groups) & (member < group_size)
    x = tl.load(y_ptr + row * N + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / group_size
    centered = tl.where(mask, x - mean[:, None], 0.0)
    inv_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=1) / group_size + eps)
    gamma = tl.load(gamma_ptr + cols, mask=mask)
    beta = tl.load(beta_ptr + cols, mask=mask)
    tl.store(out_ptr + row * N + cols, centered * inv_std[:, None] * gamma + beta, mask=mask)


class ModelNew(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, num_groups: int, bias_shape: tuple
    ) -> None:
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.matmul.weight
        M, K = x.shape
        N = weight.shape[0]
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        linear_swish_bias_kernel[grid](
            x,
            weight,
            self.matmul.bias,
            self.bias,
            y,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            weight.stride(0),
            weight.stride(1),
            BM=32,
            BN=32,
            BK=32,
        )
        norm = self.group_norm
        group_size = N // norm.num_groups
        out = torch.empty_like(y)
        group_norm_kernel[(M,)](
            y,
            norm.weight,
            norm.bias,
            out,
            N,
            norm.num_groups,
            group_size,
            norm.eps,
            BG=triton.next_power_of_2(norm.num_groups),
            BS=triton.next_power_of_2(group_size),
        )
        return out
