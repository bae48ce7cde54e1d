"""Triton solution for KernelBench level1/63_conv_standard_2D__square_input__square_kernel.py:
the convolution as an implicit GEMM. Output pixels (batch, row, column) are the GEMM's
rows, output channels its columns, and (input channel, kernel row, kernel column) its
reduction; each step gathers a tile of input patches and multiplies it with a tile of
weights in tl.dot (full fp32 precision). Stride, padding and dilation as nn.Conv2d has
them; groups=1 (the task's)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv2d_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    batch,
    c_in,
    height,
    width,
    c_out,
    out_h,
    out_w,
    stride,
    padding,
    dilation,
    KH: tl.constexpr,
    KW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BP: tl.constexpr,
    BC: tl.constexpr,
    BR: tl.constexpr,
):
    pixels = tl.program_id(0) * BP + tl.arange(0, BP)
    channels = tl.program_id(1) * BC + tl.arange(0, BC)
    n_pixels = batch * out_h * out_w
    image = pixels // (out_h * out_w)
    row = (pixels // out_w) % out_h
    col = pixels % out_w
    reduction = c_in * KH * KW
    acc = tl.zeros((BP, BC), dtype=tl.float32)
    for r0 in range(0, reduction, BR):
        r = r0 + tl.arange(0, BR)
        c = r // (KH * KW)
        kh = (r // KW) % KH
        kw = r % KW
        ih = row[:, None] * stride - padding + kh[None, :] * dilation
        iw = col[:, None] * stride - padding + kw[None, :] * dilation
        x_mask = (pixels[:, None] < n_pixels) & (r[None, :] < reduction)
        x_mask &= (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
        x_offsets = ((image[:, None] * c_in + c[None, :]) * height + ih) * width + iw
        patches = tl.load(x_ptr + x_offsets, mask=x_mask, other=0.0)
        w_mask = (r[:, None] < reduction) & (channels[None, :] < c_out)
        weights = tl.load(
            w_ptr + channels[None, :] * reduction + r[:, None], mask=w_mask, other=0.0
        )
        acc += tl.dot(patches, weights, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + channels, mask=channels < c_out, other=0.0)[None, :]
    y_offsets = ((image[:, None] * c_out + channels[None, :]) * out_h + row[:, None]) * out_w
    y_mask = (pixels[:, None] < n_pixels) & (channels[None, :] < c_out)
    tl.store(y_ptr + y_offsets + col[:, None], acc, mask=y_mask)


class ModelNew(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = False,
    ) -> None:
        super().__init__()
        if groups != 1:
            raise ValueError("this solution implements groups=1 only")
        self.conv2d = nn.Conv2d(
            in_channels,
            out_channels,
            (kernel_size, kernel_size),
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        conv = self.conv2d
        batch, c_in, height, width = x.shape
        c_out = conv.out_channels
        kh, kw = conv.kernel_size
        stride, padding, dilation = conv.stride[0], conv.padding[0], conv.dilation[0]
        out_h = (height + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
        out_w = (width + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
        y = torch.empty((batch, c_out, out_h, out_w), dtype=x.dtype, device=x.device)
        bias = conv.bias if conv.bias is not None else conv.weight
        grid = (triton.cdiv(batch * out_h * out_w, 64), triton.cdiv(c_out, 32))
        conv2d_kernel[grid](
            x,
            conv.weight,
            bias,
            y,
            batch,
            c_in,
            height,
            width,
            c_out,
            out_h,
            out_w,
            stride,
            padding,
            dilation,
            KH=kh,
            KW=kw,
            HAS_BIAS=conv.bias is not None,
            BP=64,
            BC=32,
            BR=32,
        )
        return y
