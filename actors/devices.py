"""What each verifier of a daemon owns (``kernelflow daemon --devices``): a GPU, or a set
of cores of its own. Pure: the daemon's configuration (``DaemonConfig.verifier_configs``)
and what ``kernelflow health`` calls each verifier.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from kernelflow.verification.engine import VerifierConfig

__all__ = [
    "core_ranges",
    "cpu_verifiers",
    "device_label",
    "gpu_verifiers",
    "split_cores",
    "usable_cores",
]


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity; every core elsewhere)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return tuple(range(os.cpu_count() or 1))


def split_cores(cores: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``cores`` split into ``n`` disjoint sets of consecutive cores (in their order),
    as even as they go: sizes differ by one at most, the larger first. ValueError when
    there are fewer cores than sets."""
    ordered = sorted(set(cores))
    if n < 1:
        raise ValueError(f"{n} CPU verifiers: at least one")
    if n > len(ordered):
        raise ValueError(
            f"{n} CPU verifiers need {n} cores; this process may use {len(ordered)} "
            f"({core_ranges(ordered)})"
        )
    size, larger = divmod(len(ordered), n)
    sets, start = [], 0
    for index in range(n):
        end = start + size + (1 if index < larger else 0)
        sets.append(tuple(ordered[start:end]))
        start = end
    return sets


def cpu_verifiers(
    base: VerifierConfig, n: int, cores: Sequence[int] | None = None
) -> list[VerifierConfig]:
    """``n`` CPU verifiers, each pinned to a disjoint set of ``cores`` (default: this
    process's): its judge, its candidate's process and its builds run there, and its
    timing computes with as many threads as it has cores (fewer where ``base.threads``
    asks for fewer)."""
    sets = split_cores(cores if cores is not None else usable_cores(), n)
    return [
        replace(
            base,
            device="cpu",
            gpu=None,
            cores=own,
            threads=min(base.threads or len(own), len(own)),
        )
        for own in sets
    ]


def gpu_verifiers(base: VerifierConfig, gpus: Sequence[str]) -> list[VerifierConfig]:
    """One verifier per GPU, each owning its device: its sandboxes see that one only
    (``CUDA_VISIBLE_DEVICES``), its timings queue for that device's slot."""
    return [replace(base, gpu=gpu, device="cuda") for gpu in gpus]


def device_label(config: VerifierConfig) -> str:
    """The device a verifier owns, in words: its GPU, its cores (``cpu:0-3``), or "any"."""
    if config.gpu:
        return config.gpu
    if config.cores:
        return "cpu:" + core_ranges(config.cores)
    return "any"


def core_ranges(cores: Sequence[int]) -> str:
    """``0-3,8,10-11`` for cores 0, 1, 2, 3, 8, 10, 11."""
    ranges: list[list[int]] = []
    for core in sorted(set(cores)):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)
