"""Sandboxed verification of one candidate kernel against a KernelBench reference.

Run as ``python -I sandbox_child.py WORKDIR`` by :mod:`actors.verifier.engine`, never
imported by the daemon. Standalone on purpose (stdlib + torch/triton/numpy only): with
``-I`` nothing from the kernelflow checkout is importable, and candidate code must never
share a process with the daemon.

Protocol: the parent writes ``WORKDIR/job.json`` and sends a one-line nonce on stdin; this
script writes ``WORKDIR/result.json`` (the fields of ``VerificationReport`` plus the nonce,
so a candidate cannot forge a verdict just by writing that file) and exits 0. Anything else
(a crash, a timeout, no result) is turned into a verdict by the parent.

``python -I sandbox_child.py --probe DEVICE MEMORY_KIND MEMORY_MB`` applies the same limits,
imports torch and triton (and touches the GPU for DEVICE=cuda) and prints ``ok``: the parent
uses it once to find out which isolation settings work on this machine.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import math
import os
import random
import resource
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

MAX_TRACEBACK_LINES = 30
MAX_LINE_CHARS = 400
MAX_MISMATCHES = 5
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    # (atol, rtol), as in KernelBench.
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
TIMING_WARMUP = 5
TIMING_REPS = 50
FILE_SIZE_LIMIT = 64 * 1024 * 1024


# --------------------------------------------------------------------------- limits


def apply_limits(memory_kind: str, memory_mb: int) -> None:
    """Limit this process before any untrusted code runs.

    Set here rather than in a ``preexec_fn``: the daemon is multi-threaded and
    ``preexec_fn`` is not fork-safe there. Soft and hard limits are both lowered so the
    candidate cannot raise them again (short of privileges the sandbox drops when it can).

    ``memory_kind`` is "as" (address space: exact, fine for CPU torch and the Triton
    interpreter), "data" (RLIMIT_DATA: CUDA reserves terabytes of virtual address space,
    which RLIMIT_AS would refuse, but its reservations are not counted as data) or "none".
    """
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    if memory_kind != "none" and memory_mb > 0:
        which = resource.RLIMIT_AS if memory_kind == "as" else resource.RLIMIT_DATA
        limit = memory_mb * 1024 * 1024
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(which, (limit, limit))


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the daemon that started it dies: the
    daemon's timeout is what bounds a candidate, so an orphan must not outlive it."""
    parent = os.getppid()
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the daemon's process-group kill is the only guard
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def probe(device: str, memory_kind: str, memory_mb: int) -> int:
    apply_limits(memory_kind, memory_mb)
    import torch
    import triton  # noqa: F401  (importing is the check)

    if device == "cuda":
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        assert float(x.sum()) == 1024.0
    print("ok", flush=True)
    return 0


# --------------------------------------------------------------------------- helpers


class VerificationFailure(Exception):
    """The candidate ran but produced wrong results; carries the report fields."""

    def __init__(self, summary: str, errors: list[str], **fields: Any) -> None:
        super().__init__(summary)
        self.summary = summary
        self.errors = errors
        self.fields = fields


class CandidateCrashed(Exception):
    """An exception escaped candidate code (import, construction or forward)."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(stage)
        self.stage = stage
        self.exc = exc


def _finite(x: float | None) -> float | None:
    # result.json must be strict JSON (msgspec rejects NaN/Infinity).
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def format_exception(exc: BaseException, workdir: str) -> list[str]:
    """A traceback an LLM coder can act on: its own frames, the raising frame, the error.

    Library frames (torch, triton internals) between them are elided; the exception chain
    is kept because Triton wraps the real error (e.g. an InterpreterError caused by a
    NameError inside the kernel). Paths are made relative to the work dir, so the coder
    reads ``candidate.py``.
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    chain.reverse()

    prefix = workdir.rstrip("/") + "/"
    lines: list[str] = []
    for i, err in enumerate(chain):
        if i:
            direct = chain[i - 1] is err.__cause__
            lines.append(
                "The above exception was the direct cause of the following exception:"
                if direct
                else "During handling of the above exception, another exception occurred:"
            )
        frames = traceback.extract_tb(err.__traceback__)
        if frames:
            lines.append("Traceback (most recent call last):")
            skipped = 0
            for j, frame in enumerate(frames):
                if frame.filename.startswith(prefix) or j == len(frames) - 1:
                    if skipped:
                        lines.append(f"  ... {skipped} library frame(s) ...")
                        skipped = 0
                    lines.extend("".join(traceback.format_list([frame])).rstrip("\n").split("\n"))
                else:
                    skipped += 1
        lines.extend(
            "".join(traceback.format_exception_only(type(err), err)).rstrip("\n").split("\n")
        )
    cleaned = [(ln.replace(prefix, "")[:MAX_LINE_CHARS]) for ln in lines if ln.strip() != ""]
    if len(cleaned) > MAX_TRACEBACK_LINES:
        cleaned = ["... (earlier lines trimmed)", *cleaned[-MAX_TRACEBACK_LINES:]]
    return cleaned


def load_module(path: Path, name: str) -> Any:
    """Import a module from a file under a unique name.

    Registered in ``sys.modules`` before execution: dataclasses, pickling and Triton's
    source lookup (``inspect.getsource`` for ``@triton.jit``) expect a real module.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional for the check itself
        pass


def to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(clone(v) for v in value)
    return value


def flatten(value: Any, path: str) -> list[tuple[str, Any]]:
    """Leaves of an output: tensors, or tuples/lists of them (nested), with a path name."""
    if isinstance(value, list | tuple):
        out: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            out.extend(flatten(v, f"{path}[{i}]"))
        return out
    return [(path, value)]


def structure(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def same_values(a: Any, b: Any) -> bool:
    """Exact equality, NaN-aware (used for the input-mutation check)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


# --------------------------------------------------------------------------- comparison


def compare_tensor(
    name: str, expected: Any, got: Any, tolerances: dict[str, tuple[float, float]]
) -> tuple[float, float]:
    """Raise VerificationFailure if ``got`` differs from ``expected``; return (abs, rel) err."""
    import torch

    if type(got) is not torch.Tensor:
        # Tensor subclasses and lazy wrappers can fake comparisons; demand a plain tensor.
        raise VerificationFailure(
            f"{name}: expected a torch.Tensor, got {type(got).__name__}",
            [
                f"{name} must be a plain torch.Tensor, got {type(got).__module__}."
                f"{type(got).__qualname__}"
            ],
        )
    if got.shape != expected.shape:
        raise VerificationFailure(
            f"{name}: shape mismatch: expected {tuple(expected.shape)}, got {tuple(got.shape)}",
            [
                f"{name} has shape {tuple(got.shape)} but the reference returns shape "
                f"{tuple(expected.shape)}"
            ],
        )
    if got.dtype != expected.dtype:
        raise VerificationFailure(
            f"{name}: dtype mismatch: expected {expected.dtype}, got {got.dtype}",
            [f"{name} has dtype {got.dtype} but the reference returns {expected.dtype}"],
        )
    if got.device != expected.device:
        raise VerificationFailure(
            f"{name}: device mismatch: expected {expected.device}, got {got.device}",
            [f"{name} is on device {got.device} but the reference output is on {expected.device}"],
        )
    if got.numel() == 0:
        return 0.0, 0.0

    dtype_name = str(expected.dtype).removeprefix("torch.")
    exact = not (expected.is_floating_point() or expected.is_complex())
    atol, rtol = (0.0, 0.0) if exact else tolerances.get(dtype_name, tolerances["float32"])

    exp64 = expected.detach().to(torch.complex128 if expected.is_complex() else torch.float64)
    got64 = got.detach().to(exp64.dtype)
    # NaN and +/-Inf must appear at the same positions; elsewhere compare with tolerances.
    special_bad = (
        (torch.isnan(exp64) != torch.isnan(got64))
        | (torch.isinf(exp64) & (exp64 != got64))
        | (torch.isinf(got64) & (exp64 != got64))
    )
    finite = torch.isfinite(exp64) & torch.isfinite(got64)
    diff = torch.where(
        finite, (got64 - exp64).abs(), torch.zeros((), dtype=torch.float64, device=exp64.device)
    )
    rel = diff / exp64.abs().clamp_min(1e-6)
    bad = special_bad | (finite & (diff > atol + rtol * exp64.abs()))
    max_abs = float(diff.max())
    max_rel = float(torch.where(finite, rel, torch.zeros_like(rel)).max())

    n_bad = int(bad.sum())
    if n_bad:
        idx = torch.nonzero(bad)[:MAX_MISMATCHES].tolist()
        mismatches = []
        for pos in idx:
            key = tuple(pos)
            e, g = exp64[key].item(), got64[key].item()
            where = ", ".join(str(p) for p in pos)
            mismatches.append(
                f"{name}[{where}]: expected {_fmt(e) if not exact else e}, "
                f"got {_fmt(g) if not exact else g}"
            )
        total = got.numel()
        tol = "exact match" if exact else f"atol={atol:g}, rtol={rtol:g}"
        n_nan = int(special_bad.sum())
        detail = (
            f"{name}: {n_bad} of {total} elements ({100.0 * n_bad / total:.3g}%) differ from "
            f"the reference ({tol}); max abs err {_fmt(max_abs)}, max rel err {_fmt(max_rel)}"
        )
        if n_nan:
            detail += f"; {n_nan} element(s) have NaN/Inf where the reference does not (or "
            detail += "vice versa)"
        raise VerificationFailure(
            detail,
            [detail, "first mismatching positions: " + "; ".join(mismatches)],
            max_abs_err=max_abs,
            max_rel_err=max_rel,
            mismatches=mismatches,
        )
    return max_abs, max_rel


def compare_outputs(
    expected: Any, got: Any, tolerances: dict[str, tuple[float, float]]
) -> tuple[float, float]:
    import torch

    exp_leaves, got_leaves = flatten(expected, "output"), flatten(got, "output")
    if len(exp_leaves) != len(got_leaves) or (
        isinstance(expected, list | tuple) != isinstance(got, list | tuple)
    ):
        msg = (
            f"output structure mismatch: reference returns {structure(expected)}, "
            f"candidate returns {structure(got)}"
        )
        raise VerificationFailure(msg, [msg])
    max_abs = max_rel = 0.0
    for (name, exp), (_, out) in zip(exp_leaves, got_leaves, strict=True):
        if isinstance(exp, torch.Tensor):
            a, r = compare_tensor(name, exp, out, tolerances)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
        elif exp != out:
            msg = f"{name}: expected {exp!r}, got {out!r}"
            raise VerificationFailure(msg, [msg])
    return max_abs, max_rel


# --------------------------------------------------------------------------- timing


def time_cuda(ref: Any, cand: Any, inputs: list[Any]) -> float | None:
    """Median reference time / median candidate time, with CUDA events.

    Deliberately simple (the full harness with L2 flushes and quantiles lives elsewhere):
    warm-up, then reference and candidate interleaved so clock and thermal drift hit both.
    """
    import torch

    ref_in, cand_in = clone(inputs), clone(inputs)
    with torch.no_grad():
        for _ in range(TIMING_WARMUP):
            ref(*ref_in)
            cand(*cand_in)
        torch.cuda.synchronize()
        ref_ms: list[float] = []
        cand_ms: list[float] = []
        for _ in range(TIMING_REPS):
            for model, args, sink in ((ref, ref_in, ref_ms), (cand, cand_in, cand_ms)):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                model(*args)
                end.record()
                torch.cuda.synchronize()  # device-wide: work on side streams is counted
                sink.append(start.elapsed_time(end))
    ref_med, cand_med = statistics.median(ref_ms), statistics.median(cand_ms)
    if cand_med <= 0:
        return None
    return ref_med / cand_med


# --------------------------------------------------------------------------- main check


def run_job(workdir: Path, job: dict[str, Any]) -> dict[str, Any]:
    import torch

    device: str = job.get("device", "cpu")
    trials = max(1, int(job.get("trials", 3)))
    seed = int(job.get("seed", 0))
    tolerances = dict(DEFAULT_TOLERANCES)
    for key, value in (job.get("tolerances") or {}).items():
        tolerances[key] = (float(value[0]), float(value[1]))
    tolerances.setdefault("float64", tolerances["float32"])

    if device == "cuda":
        # Full-precision fp32 reference: TF32 would loosen it beyond the tolerances.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    wd = str(workdir)
    base = {"device": device, "trials": 0}

    def error(summary: str, lines: list[str], trials_done: int = 0) -> dict[str, Any]:
        # One feedback entry: the (trimmed) traceback reads best as a single block.
        return {
            **base,
            "verdict": "error",
            "summary": summary,
            "errors": ["\n".join(lines)],
            "trials": trials_done,
        }

    # The reference comes first: a broken task is not the coder's fault.
    try:
        task = load_module(workdir / job["task_file"], f"kf_task_{tag}")
    except BaseException as exc:
        return error("the reference task failed to import", format_exception(exc, wd))
    try:
        cand_mod = load_module(workdir / job["candidate_file"], f"kf_candidate_{tag}")
    except BaseException as exc:
        tb = format_exception(exc, wd)
        return error(f"candidate failed to import: {tb[-1] if tb else type(exc).__name__}", tb)
    model_cls = getattr(task, "Model", None)
    new_cls = getattr(cand_mod, "ModelNew", None)
    if model_cls is None:
        return error("the reference task defines no Model", ["task.py defines no Model"])
    if new_cls is None:
        msg = "candidate module defines no ModelNew after import"
        return error(msg, [msg])

    max_abs = max_rel = 0.0
    ref_model = cand_model = None
    inputs: list[Any] = []
    for trial in range(trials):
        trial_seed = seed * 1_000_003 + trial
        stage = "reference"
        try:
            # Same seed before each constructor: parameters initialised in the same order
            # come out identical, as KernelBench does.
            seed_all(trial_seed)
            ref_model = model_cls(*task.get_init_inputs())
            ref_model = ref_model.to(device).eval()
            stage = "ModelNew(...) construction"
            seed_all(trial_seed)
            cand_model = new_cls(*task.get_init_inputs())
            if hasattr(cand_model, "to"):
                cand_model = cand_model.to(device)
            if hasattr(cand_model, "eval"):
                cand_model = cand_model.eval()
            stage = "reference"
            seed_all(trial_seed + 7919)  # a different stream for the inputs
            inputs = list(to_device(task.get_inputs(), device))
            ref_in, cand_in = clone(inputs), clone(inputs)
            with torch.no_grad():
                expected = ref_model(*ref_in)
                if device == "cuda":
                    torch.cuda.synchronize()
                stage = "ModelNew.forward"
                got = cand_model(*cand_in)
                if device == "cuda":
                    # Asynchronous kernel faults surface here: still the candidate's.
                    torch.cuda.synchronize()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = format_exception(exc, wd)
            last = tb[-1] if tb else type(exc).__name__
            if stage == "reference":
                return error(f"the reference model failed in trial {trial + 1}: {last}", tb, trial)
            return error(f"candidate raised in {stage} (trial {trial + 1}): {last}", tb, trial)

        try:
            # Kernels must not write to their inputs. Compared with the reference's inputs
            # after its run, so a task whose reference is itself in-place stays checkable.
            for i, (before, after) in enumerate(
                zip(flatten(ref_in, "input"), flatten(cand_in, "input"), strict=True)
            ):
                if isinstance(before[1], torch.Tensor) and not same_values(before[1], after[1]):
                    msg = (
                        f"input mutation: the candidate modified input #{i} in place "
                        "(the reference does not); kernels must not write to their inputs"
                    )
                    raise VerificationFailure(msg, [msg])
            a, r = compare_outputs(expected, got, tolerances)
        except VerificationFailure as failure:
            fields = {
                "max_abs_err": _finite(failure.fields.get("max_abs_err")),
                "max_rel_err": _finite(failure.fields.get("max_rel_err")),
                "mismatches": failure.fields.get("mismatches", []),
            }
            return {
                **base,
                **fields,
                "verdict": "fail",
                "trials": trial + 1,
                "summary": f"trial {trial + 1}/{trials}: {failure.summary}",
                "errors": failure.errors,
            }
        max_abs, max_rel = max(max_abs, a), max(max_rel, r)

    speedup: float | None = None
    notes: list[str] = []
    # Interpreted Triton on CPU has no meaningful timing: speedup stays null there.
    if device == "cuda":
        try:
            speedup = _finite(time_cuda(ref_model, cand_model, inputs))
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            notes = ["timing failed: " + " | ".join(format_exception(exc, wd)[-3:])]
    summary = f"all {trials} trial(s) match the reference (max abs err {_fmt(max_abs)})"
    if speedup is not None:
        summary += f"; speedup {speedup:.2f}x"
    return {
        **base,
        "verdict": "pass",
        "summary": summary,
        "errors": notes,
        "max_abs_err": _finite(max_abs),
        "max_rel_err": _finite(max_rel),
        "trials": trials,
        "speedup": speedup,
    }


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--probe":
        return probe(argv[2], argv[3], int(argv[4]))
    if len(argv) != 2:
        print("usage: sandbox_child.py WORKDIR", file=sys.stderr)
        return 2
    # Candidate prints must survive a crash (os._exit, segfault) to be shown as feedback.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # A segfault in a kernel then still prints the Python stack (candidate.py line).
    faulthandler.enable()
    # Read before anything untrusted runs; the nonce then only lives in this frame.
    nonce = sys.stdin.readline().strip()
    workdir = Path(argv[1]).resolve()
    job = json.loads((workdir / "job.json").read_text())
    apply_limits(job.get("memory_kind", "as"), int(job.get("memory_mb", 0)))
    started = time.perf_counter()
    try:
        result = run_job(workdir, job)
    except BaseException as exc:  # a bug here must still produce a readable verdict
        result = {
            "verdict": "error",
            "summary": f"verifier internal error: {exc!r}",
            "errors": ["\n".join(format_exception(exc, str(workdir)))],
            "device": str(job.get("device") or ""),
        }
    result["duration_s"] = time.perf_counter() - started
    result["nonce"] = nonce
    (workdir / "result.json").write_text(json.dumps(result, allow_nan=False))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip atexit handlers and interpreter teardown: candidate code may have registered
    # some (to rewrite result.json, or to hang).
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
