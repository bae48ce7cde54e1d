"""Runtime guards around the candidate's calls: ATen ops outside kernel launches (PyTorch
computing in the kernel's place), kernel launches counted, threads and processes left
running, outputs that share memory with inputs or parameters. Candidate-running side.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from kernelflow.verification.child.loading import flatten
from kernelflow.verification.child.report import rejected

__all__ = [
    "LAUNCHES",
    "LastOutputs",
    "check_output_storage",
    "guarded_forward",
    "os_threads",
    "overlaps",
    "storages",
]

# ATen ops a candidate's forward may run outside its kernels: allocation, views, copies,
# dtype/device moves. Anything else is PyTorch computing in the kernel's place.
GLUE_OPS = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "zeros",
    "zeros_like",
    "new_zeros",
    "ones",
    "ones_like",
    "new_ones",
    "full",
    "full_like",
    "new_full",
    "fill_",
    "zero_",
    "arange",
    "scalar_tensor",
    "lift_fresh",
    "lift_fresh_copy",
    "view",
    "_unsafe_view",
    "reshape",
    "as_strided",
    "expand",
    "permute",
    "transpose",
    "t",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "narrow",
    "split",
    "split_with_sizes",
    "unbind",
    "chunk",
    "flatten",
    "unflatten",
    "alias",
    "detach",
    "clone",
    "contiguous",
    "copy_",
    "_to_copy",
    "to",
    "cat",
    "stack",
    "constant_pad_nd",
    "_local_scalar_dense",
    "is_same_size",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_contiguous",
    "resize_",
    "set_",
    "view_as",
    "expand_as",
    "movedim",
    "_reshape_alias",
}


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def child_processes() -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            text = Path(f"/proc/self/task/{tid}/children").read_text().split()
            kids.extend(int(k) for k in text)
    except OSError:
        pass
    return kids


class Launches:
    """Counts kernel launches (a backend makes each of its launches go through
    :meth:`launching`), and tells the op guard to look away while a launch runs (the
    Triton interpreter copies tensors around)."""

    def __init__(self) -> None:
        self.count = 0
        self.depth = 0

    def refuse(self, rule: str, message: str) -> NoReturn:
        raise rejected(rule, message)

    @contextlib.contextmanager
    def launching(self) -> Iterator[None]:
        self.count += 1
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


# The sandbox's one counter: the backend's launch hooks and the guards share it.
LAUNCHES = Launches()


def make_op_guard() -> Any:
    """A TorchDispatchMode that records every non-glue ATen op run outside a kernel launch:
    PyTorch computing in the kernel's place, whatever Python spelling reached it.

    Like every mode, its ``__torch_dispatch__`` is never traced by torch.compile; torch
    ensures that by wrapping it in ``torch._dynamo.disable``, importing torch._dynamo at
    the first op (2+ s, in every sandbox). Here the wrapping waits until torch._dynamo is
    loaded: until then nothing can be compiling."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpGuard(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bad: dict[str, int] = {}
            self._untraced: Any = None

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # torch's own wrapping (above) is left out; ours is below

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if self._untraced is None and "torch._dynamo" in sys.modules:
                self._untraced = sys.modules["torch._dynamo"].disable(
                    self._record, recursive=True, wrapping=False
                )
            if self._untraced is not None:
                return self._untraced(func, args, kwargs)
            return self._record(func, args, kwargs)

        def _record(self, func: Any, args: Any, kwargs: Any) -> Any:
            if LAUNCHES.depth == 0:
                name = func.overloadpacket.__name__
                if name not in GLUE_OPS and name.rstrip("_") not in GLUE_OPS:
                    self.bad[name] = self.bad.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return OpGuard()


def warm_up_thread_pools() -> None:
    """Start the thread pools torch and numpy start lazily (intra-op, BLAS) before the
    baseline is counted, so that a legitimate first large op (a matmul, a copy above
    torch's parallel grain, the Triton interpreter's numpy tl.dot) is not taken for a
    thread the candidate started. Each pool starts only for work large enough to split."""
    import torch

    a = torch.ones(256, 256)
    (a @ a).sum()
    torch.ones(1 << 17).add_(1.0).relu_()  # above at::parallel_for's grain: the intra-op pool
    try:
        import numpy as np

        for dtype in (np.float32, np.float64):
            b = np.ones((256, 256), dtype=dtype)
            b @ b
    except ImportError:  # numpy is optional for the check itself
        pass


@contextlib.contextmanager
def guarded_construction(baseline_threads: int) -> Iterator[None]:
    """``ModelNew(...)`` watched as forward() is for what escapes the check: threads left
    running, child processes. (Its ops are not: building parameters computes.)"""
    yield
    threads = os_threads()
    if threads > baseline_threads:
        raise rejected(
            "threads",
            f"ModelNew(...) left {threads - baseline_threads} extra thread(s) running",
        )
    kids = child_processes()
    if kids:
        raise rejected("processes", f"ModelNew(...) started {len(kids)} child process(es)")


def guarded_forward(
    model: Any,
    inputs: Any,
    device: str,
    baseline_threads: int,
    launch_label: str,
    warned_rules: frozenset[str] = frozenset(),
) -> tuple[Any, list[str]]:
    """One forward call with ops, launches, threads and processes all watched: at least
    one launch of ``launch_label`` ("" checks none), no more threads than
    ``baseline_threads``, no child process; PyTorch compute outside the launches refused,
    or, where ``warned_rules`` holds ``torch_compute`` (the task's policy), recorded. The
    outputs, and the warnings."""
    import torch

    guard = make_op_guard()
    LAUNCHES.count = 0
    with torch.no_grad(), guard:
        got = model(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()  # device-wide: work on side streams is finished too
    warnings: list[str] = []
    if guard.bad:
        ops = ", ".join(f"{k}" for k in sorted(guard.bad)[:6])
        if "torch_compute" not in warned_rules:
            raise rejected(
                "torch_compute",
                f"forward() ran PyTorch compute ops outside the kernel: {ops} (only "
                "allocation, views, reshapes and copies may surround the kernel)",
            )
        warnings.append(f"torch_compute: forward() runs PyTorch compute ops: {ops}")
    if LAUNCHES.count == 0 and launch_label:
        raise rejected(
            "no_kernel_launch",
            f"forward() launched no {launch_label}: the kernel must do the work",
        )
    threads = os_threads()
    if threads > baseline_threads:
        raise rejected(
            "threads",
            f"forward() left {threads - baseline_threads} extra thread(s) running "
            "(work escaping the timer or the check)",
        )
    kids = child_processes()
    if kids:
        raise rejected("processes", f"forward() started {len(kids)} child process(es)")
    return got, warnings


def storages(value: Any) -> list[tuple[int, int]]:
    """(start, end) byte ranges of the storages behind every tensor leaf of ``value``."""
    import torch

    spans = []
    for _, t in flatten(value, "x"):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            if st.nbytes():
                spans.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
    return spans


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


class LastOutputs:
    """The last call's outputs, kept alive (memory freed is the allocator's to reuse, and
    an honest call's new output could land there), and whether each next call's outputs
    are in memory of their own: not that call's (a cached or reused result)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value
        self.spans = storages(value) if value is not None else []

    def take(self, got: Any) -> bool:
        """Keep ``got`` as the last outputs; whether it shares no memory with the ones
        before."""
        spans = storages(got)
        fresh = not overlaps(spans, self.spans)
        self.value, self.spans = got, spans
        return fresh


def check_output_storage(got: Any, inputs: Any, model: Any) -> None:
    """Outputs must be plain tensors with data, in memory of their own: not an input's,
    not a parameter's or buffer's of ``model``."""
    import torch

    for name, t in flatten(got, "output"):
        if not isinstance(t, torch.Tensor):
            continue
        if type(t) is not torch.Tensor:
            raise rejected(
                "output_type",
                f"{name} must be a plain torch.Tensor, got {type(t).__module__}."
                f"{type(t).__qualname__} (tensor subclasses and lazy tensors are not allowed)",
            )
        if t.is_meta or getattr(t, "_is_zerotensor", lambda: False)():
            raise rejected("output_type", f"{name} is a meta/zero tensor without data")
        mine = storages(t)
        if overlaps(mine, storages(inputs)):
            raise rejected(
                "output_aliasing",
                f"{name} shares memory with an input: outputs must have their own storage",
            )
        params = (
            [p for p in model.parameters()] + [b for b in model.buffers()]
            if hasattr(model, "parameters")
            else []
        )
        if overlaps(mine, storages(params)):
            raise rejected(
                "output_aliasing",
                f"{name} shares memory with a parameter or buffer of ModelNew",
            )
