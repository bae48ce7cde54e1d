"""The machine's peaks, measured once per node and cached (docs/verifier.md, "The
machine's peaks").

The roofline of a timed candidate needs the memory bandwidth of a large copy and the
throughput of a square matmul in the inputs' dtype, measured where candidates are timed.
Measuring them takes a second or more of every timed check, so a node measures them once:
the cache is ``peaks.json`` in the node's timing dir (``VerifierConfig.timing_lock_dir``,
the data dir's ``timing``), keyed by what changes the figures (the host, the device and
the GPU a verifier owns, the threads and the cores it computes on), and each entry holds the
copy bandwidth and the matmul throughput by dtype. A job carries its entry
(``job["peaks"]``); the judge measures only what the entry lacks (in a timing slot) and
leaves that in its work dir, which the parent merges into the cache here. A cache that is
missing, unreadable or corrupt counts as empty: the peaks are measured again and the file
is replaced, never a failed check.

Parent side: no torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelflow.verification.child.roofline import PEAKS_FILE

__all__ = ["CACHE_FILE", "cached_peaks", "peaks_key", "record_peaks"]

CACHE_FILE = "peaks.json"  # in the node's timing dir


def peaks_key(device: str, gpu: str | None, threads: int, cores: Sequence[int]) -> str:
    """The cache entry of a verifier timing on ``device`` (the GPU ``gpu`` it owns), with
    ``threads`` threads on ``cores``."""
    where = device if device == "cpu" else f"{device}:{gpu or 'all'}"
    return f"{socket.gethostname()} {where} threads={threads} cores={_ranges(cores)}"


def cached_peaks(directory: str | Path, key: str) -> dict[str, Any]:
    """The peaks cached under ``key`` (``copy_gbs``, ``matmul_gflops`` by dtype name);
    empty where the cache has none or cannot be read."""
    return _valid(_read(Path(directory, CACHE_FILE)).get(key))


def record_peaks(directory: str | Path, key: str, workdir: str | Path) -> None:
    """Merge what a judge measured (``WORKDIR/peaks.json``, if it measured anything) into
    the cache under ``key``. Never raises: a cache that cannot be written is measured
    again next time."""
    measured = _valid(_read(Path(workdir, PEAKS_FILE)))
    if not measured:
        return
    path = Path(directory, CACHE_FILE)
    with contextlib.suppress(OSError):
        cache = _read(path)
        entry = _valid(cache.get(key))
        gflops = {**entry.get("matmul_gflops", {}), **measured.get("matmul_gflops", {})}
        cache[key] = {
            "copy_gbs": measured.get("copy_gbs") or entry.get("copy_gbs"),
            "matmul_gflops": gflops,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".peaks-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(cache, out, indent=1, sort_keys=True)
            os.replace(name, path)  # readers see the old file or the new one, whole
        except OSError:
            Path(name).unlink(missing_ok=True)
            raise


def _read(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON
        return {}
    return found if isinstance(found, dict) else {}


def _valid(entry: Any) -> dict[str, Any]:
    """The figures of ``entry`` that are finite and positive (nothing else is kept)."""
    if not isinstance(entry, dict):
        return {}
    kept: dict[str, Any] = {}
    if _figure(entry.get("copy_gbs")):
        kept["copy_gbs"] = float(entry["copy_gbs"])
    gflops = entry.get("matmul_gflops")
    if isinstance(gflops, dict):
        by_dtype = {str(k): float(v) for k, v in gflops.items() if _figure(v)}
        if by_dtype:
            kept["matmul_gflops"] = by_dtype
    return kept


def _figure(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _ranges(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    spans: list[list[int]] = []
    for core in sorted(set(cores)):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "any"
