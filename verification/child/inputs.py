"""The inputs a check runs on, drawn by the judge where the candidate cannot predict them.

Every call gets inputs of its own, from a seed drawn from the operating system's random
source in the judge's process (never sent to the candidate, and not the seed the models'
parameters are built with), and not only from the distribution the task's
``get_inputs()`` uses: ``torch.rand`` inputs are all >= 0, so a plain copy would pass as
ReLU. A call's floating-point inputs are one of:

``published``
    what ``get_inputs()`` returns;
``signed``
    the same shapes and dtypes, normally distributed at the published values' scale, so
    both signs appear;
``edges``
    signed values with some replaced by the values kernels branch on: exact zeros, tiny
    values of both signs, and large ones.

Integer and boolean inputs (indices, masks) always stay as published. The judge falls back
to ``published`` for a call where the reference itself is not finite on another variant
(``log`` of a negative number): the reference decides where the task is defined.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import secrets
from typing import Any

from kernelflow.verification.child.loading import seed_all, to_device

__all__ = ["VARIANTS", "draw_inputs", "draw_seed", "variant_of_call"]

VARIANTS = ("published", "signed", "edges")
# Of the elements of an ``edges`` input, the share replaced by each kind of special value.
_EDGE_SHARE = 0.04


def draw_seed(fixed: int | None, *salt: int) -> int:
    """A seed no one can predict; or, for a reproducible check (``fixed`` given, as a
    debugging aid), one derived from ``fixed`` and ``salt``."""
    if fixed is None:
        return secrets.randbits(62)
    value = fixed
    for s in salt:
        value = (value * 1_000_003 + s) % (1 << 62)
    return value


def variant_of_call(trial: int, call: int) -> str:
    """Which inputs call ``call`` (0 or 1) of trial ``trial`` gets: the two calls of every
    trial differ, and one trial covers two of the three."""
    return VARIANTS[(2 * trial + call) % len(VARIANTS)]


def draw_inputs(task: Any, seed: int, variant: str, device: str) -> list[Any]:
    """``task.get_inputs()`` under ``seed``, its floating-point tensors made ``variant``,
    on ``device``."""
    seed_all(seed)
    inputs = list(task.get_inputs())
    if variant != "published":
        inputs = [_vary(value, variant) for value in inputs]
    return list(to_device(inputs, device))


def _vary(value: Any, variant: str) -> Any:
    import torch

    if isinstance(value, list | tuple):
        return type(value)(_vary(v, variant) for v in value)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or not value.numel():
        return value
    published = value.detach().to(torch.float32)
    scale = float(published.abs().mean()) or 1.0
    varied = torch.randn(published.shape) * scale
    if variant == "edges":
        flat = varied.reshape(-1)
        n = flat.numel()
        specials = (0.0, scale * 1e-6, -scale * 1e-6, scale * 4.0, -scale * 4.0)
        for special in specials:
            count = max(1, int(n * _EDGE_SHARE))
            flat[torch.randint(0, n, (count,))] = special
    return varied.to(value.dtype)
