"""Triton solution for level2/4_conv_transpose2d_layernorm_tanh.py: the 2-D transposed
convolution in one kernel (each output gathers the input positions that map onto it:
an input index counts where ``o + padding - k`` is a multiple of the stride), then
layer norm over the last axis, tanh and the scaling in a second. The task's LayerNorm
holds ``out_channels`` values and normalises the output's last axis, its width, which
is that long wherever the reference runs."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv_transpose2d_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_out, c_in, c_out, h_in, w_in, h_out, w_out,
    STRIDE: tl.constexpr, PAD: tl.constexpr, K: tl.constexpr,
    BLOCK: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    out = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = out < n_out
    ow = out % w_out
    oh = (out // w_out) % h_out
    co = (out // (w_out * h_out)) % c_out
    image = out // (w_out * h_out * c_out)
    taps = K * K
    reduction = c_in * taps
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r0 in range(0, reduction, BR):
        r = r0 + tl.arange(0, BR)
        ci = r // taps
        kh = (r // K) % K
        kw = r % K
        # The input position that lands on this output through tap (kh, kw), if any.
        th = oh[:, None] + PAD - kh[None, :]
        tw = ow[:, None] + PAD - kw[None, :]
        hit = (th >= 0) & (tw >= 0) & (th % STRIDE == 0) & (tw % STRIDE == 0)
        ih, iw = th // STRIDE, tw // STRIDE
        hit = hit & (ih < h_in) & (iw < w_in) & live[:, None] & (r[None, :] < reduction)
        x_offsets = ((image[:, None] * c_in + ci[None, :]) * h_in + ih) * w_in + iw
        xs = tl.load(x_ptr + x_offsets, mask=hit, other=0.0)
        # weight: (c_in, c_out, K, K)
        w_offsets = (ci[None, :] * c_out + co[:, None]) * taps + (r % taps)[None, :]
        ws = tl.load(w_ptr + w_offsets, mask=hit, other=0.0)
        acc += tl.sum(xs * ws, axis=1)
    acc += tl.load(b_ptr + co, mask=live, other=0.0)
    tl.store(y_ptr + out, acc, mask=live)


@triton.jit
def layer_norm_tanh_kernel(
    y_ptr, gamma_ptr, beta_ptr, out_ptr, rows, length, eps, scale,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, BLOCK)
    mask = (row[:, None] < rows) & (col[None, :] < length)
    offsets = row[:, None] * length + col[None, :]
    v = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    mean = tl.sum(v, axis=1) / length
    centred = tl.where(mask, v - mean[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / length
    normed = centred / tl.sqrt(var + eps)[:, None]
    gamma = tl.load(gamma_ptr + col, mask=col < length, other=1.0)
    beta = tl.load(beta_ptr + col, mask=col < length, other=0.0)
    z = normed * gamma[None, :] + beta[None, :]
    # tanh(z) = 1 - 2 / (exp(2z) + 1): exp overflowing to inf gives 1, underflowing -1.
    t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    tl.store(out_ptr + offsets, t * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        padding: int,
        scale: float,
    ) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding
        )
        self.norm = nn.LayerNorm(out_channels)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        up = self.up
        batch, c_in, h_in, w_in = x.shape
        c_out, k = up.out_channels, up.kernel_size[0]
        stride, pad = up.stride[0], up.padding[0]
        h_out, w_out = ((s - 1) * stride - 2 * pad + k for s in (h_in, w_in))
        y = torch.empty((batch, c_out, h_out, w_out), dtype=x.dtype, device=x.device)
        n_out = y.numel()
        conv_transpose2d_kernel[(triton.cdiv(n_out, 256),)](
            x, up.weight.contiguous(), up.bias, y, n_out, c_in, c_out, h_in, w_in, h_out, w_out,
            STRIDE=stride, PAD=pad, K=k, BLOCK=256, BR=64,
        )  # fmt: skip
        out = torch.empty_like(y)
        rows = n_out // w_out
        layer_norm_tanh_kernel[(triton.cdiv(rows, 64),)](
            y, self.norm.weight, self.norm.bias, out, rows, w_out, self.norm.eps, self.scale,
            ROWS=64, BLOCK=triton.next_power_of_2(w_out),
        )  # fmt: skip
        return out
