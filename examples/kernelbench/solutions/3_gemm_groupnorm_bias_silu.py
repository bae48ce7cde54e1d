"""Triton solution for level2/3_gemm_groupnorm_bias_silu.py: one kernel computes
x @ W^T + b in 32 x 32 tiles of tl.dot (full fp32 precision); a second normalises each
row's groups as nn.GroupNorm does (a block of rows per program, each row a groups x
members tile), applies the norm's affine transform and the extra bias, then SiLU."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk,
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
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    y_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=y_mask)


@triton.jit
def group_norm_bias_silu_kernel(
    y_ptr, gamma_ptr, beta_ptr, bias_ptr, out_ptr, groups, members, eps,
    G: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    g = tl.arange(0, G)
    c = tl.arange(0, C)
    mask = (g[:, None] < groups) & (c[None, :] < members)
    channel = g[:, None] * members + c[None, :]
    offsets = row * groups * members + channel
    v = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    mean = tl.sum(v, axis=1) / members
    centred = tl.where(mask, v - mean[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / members
    normed = centred / tl.sqrt(var + eps)[:, None]
    gamma = tl.load(gamma_ptr + channel, mask=mask, other=0.0)
    beta = tl.load(beta_ptr + channel, mask=mask, other=0.0)
    bias = tl.load(bias_ptr + channel, mask=mask, other=0.0)
    z = normed * gamma + beta + bias
    tl.store(out_ptr + offsets, z / (1.0 + tl.exp(-z)), mask=mask)


class ModelNew(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, num_groups: int, bias_shape: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)
        with torch.no_grad():  # as the reference initialises them
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.linear.weight
        M, K = x.shape
        N = weight.shape[0]
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        linear_kernel[grid](
            x, weight, self.linear.bias, y, M, N, K, x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), BM=32, BN=32, BK=32,
        )  # fmt: skip
        groups = self.norm.num_groups
        members = N // groups
        out = torch.empty_like(y)
        group_norm_bias_silu_kernel[(M,)](
            y, self.norm.weight, self.norm.bias, self.bias.contiguous(), out, groups, members,
            self.norm.eps, G=triton.next_power_of_2(groups), C=triton.next_power_of_2(members),
        )  # fmt: skip
        return out
