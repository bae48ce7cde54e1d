"""Triton solution for level1/9_conv2d_same.py: the padded convolution as an implicit
GEMM. Output pixels (image, row, column) are the GEMM's rows, output channels its
columns, and (input channel, kernel row, kernel column) its reduction; each step gathers
a tile of input patches (zero outside the image: the padding) and multiplies it with a
tile of weights in tl.dot at full fp32 precision. The bias is added before the store."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv2d_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_pixels, c_in, height, width, c_out, out_h, out_w, pad,
    KH: tl.constexpr, KW: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    pixels = tl.program_id(0) * BP + tl.arange(0, BP)
    channels = tl.program_id(1) * BC + tl.arange(0, BC)
    image = pixels // (out_h * out_w)
    row = (pixels // out_w) % out_h
    col = pixels % out_w
    reduction = c_in * KH * KW
    acc = tl.zeros((BP, BC), dtype=tl.float32)
    for r0 in range(0, reduction, BR):
        r = r0 + tl.arange(0, BR)
        c = r // (KH * KW)
        ih = row[:, None] - pad + ((r // KW) % KH)[None, :]
        iw = col[:, None] - pad + (r % KW)[None, :]
        x_mask = (pixels[:, None] < n_pixels) & (r[None, :] < reduction)
        x_mask &= (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
        x_offsets = ((image[:, None] * c_in + c[None, :]) * height + ih) * width + iw
        patches = tl.load(x_ptr + x_offsets, mask=x_mask, other=0.0)
        w_mask = (r[:, None] < reduction) & (channels[None, :] < c_out)
        weights = tl.load(
            w_ptr + channels[None, :] * reduction + r[:, None], mask=w_mask, other=0.0
        )
        acc += tl.dot(patches, weights, input_precision="ieee")
    acc += tl.load(b_ptr + channels, mask=channels < c_out, other=0.0)[None, :]
    y_offsets = ((image[:, None] * c_out + channels[None, :]) * out_h + row[:, None]) * out_w
    y_mask = (pixels[:, None] < n_pixels) & (channels[None, :] < c_out)
    tl.store(y_ptr + y_offsets + col[:, None], acc, mask=y_mask)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        conv = self.conv
        batch, c_in, height, width = x.shape
        c_out = conv.out_channels
        kh, kw = conv.kernel_size
        pad = conv.padding[0]
        out_h, out_w = height + 2 * pad - kh + 1, width + 2 * pad - kw + 1
        y = torch.empty((batch, c_out, out_h, out_w), dtype=x.dtype, device=x.device)
        n_pixels = batch * out_h * out_w
        grid = (triton.cdiv(n_pixels, 64), triton.cdiv(c_out, 32))
        conv2d_kernel[grid](
            x, conv.weight.contiguous(), conv.bias, y, n_pixels, c_in, height, width, c_out,
            out_h, out_w, pad, KH=kh, KW=kw, BP=64, BC=32, BR=32,
        )  # fmt: skip
        return y
