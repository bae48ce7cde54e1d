"""The candidate's process: the only one where candidate code runs. It answers the judge's
requests on the channel (:mod:`.channel`) and nothing else: load the candidate's module,
build ``ModelNew`` with the seed and arguments it is given, call it on the inputs it is
given (under the runtime guards, :mod:`.guards`) and send the outputs back, or time it.

It never sees the reference, the judge's inputs before they are sent, the comparison or
the verdict, and it writes no result: whatever it claims, the judge only ever trusts the
outputs it computes itself against (see :mod:`.judge`). Its own checks (guards, memory of
its outputs) can only make it fail, which a candidate has no reason to fake.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kernelflow.verification.backends import backend
from kernelflow.verification.child.candidate import Candidate
from kernelflow.verification.child.channel import (
    Channel,
    ChannelClosed,
    decode_value,
    encode_value,
)
from kernelflow.verification.child.guards import (
    LAUNCHES,
    guarded_construction,
    os_threads,
    overlaps,
    storages,
    warm_up_thread_pools,
)
from kernelflow.verification.child.loading import clone, flatten, seed_all
from kernelflow.verification.child.report import (
    VerificationFailure,
    classify_exception,
    exception_chain,
    format_exception,
    rejected,
    wrote_outside,
)

__all__ = ["serve_judge"]


class _Runner:
    def __init__(
        self, channel: Channel, workdir: Path, notes: list[str], refusal: str | None
    ) -> None:
        self.channel = channel
        self.workdir = workdir
        self.notes = notes
        self.refusal = refusal
        self.device = "cpu"
        self.candidate: Candidate | None = None
        # The last call's outputs, kept alive: memory freed is the allocator's to reuse.
        self.previous: Any = None

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.refusal is not None:
            return {"unsupported": self.refusal}
        self.device = str(request["device"])
        dsl = backend(str(request["backend"]))
        try:
            dsl.start_runtime(self.device, LAUNCHES)
        except Exception as exc:
            return {
                "unsupported": f"backend {dsl.name!r} is unsupported on this device "
                f"({self.device}): {dsl.runtime_unavailable} ({type(exc).__name__}: {exc})"
            }
        path = self.workdir / str(request["candidate_file"])
        warm_up_thread_pools()
        warned = frozenset(str(rule) for rule in request.get("warned_rules") or [])
        candidate = Candidate.load(
            path, str(request["name"]), self.device, dsl.launch_label, warned
        )
        self.candidate = candidate
        if (threads := os_threads()) > candidate.baseline_threads:
            raise rejected(
                "threads",
                f"importing the module left {threads - candidate.baseline_threads} extra "
                "thread(s) running",
            )
        return {"has_model": candidate.model_class is not None, "notes": self.notes}

    def construct(self, request: dict[str, Any], blobs: list[bytearray]) -> dict[str, Any]:
        candidate = self._candidate()
        init = decode_value(request["init"], blobs, "cpu")
        seed_all(int(request["seed"]))
        with guarded_construction(candidate.baseline_threads):
            candidate.construct(init)
        return {}

    def forward(self, request: dict[str, Any], blobs: list[bytearray]) -> tuple[dict, list]:
        candidate = self._candidate()
        inputs = list(decode_value(request["inputs"], blobs, self.device))
        before = clone(inputs)
        got, warnings = candidate.forward(inputs)
        if not request.get("inputs_may_change"):
            _check_inputs_unchanged(before, inputs)
        candidate.check_own_memory(got, inputs)
        if overlaps(storages(got), storages(self.previous)):
            raise rejected(
                "second_run",
                "forward() returned the memory of an earlier call's output (a cached or "
                "reused result); allocate a new output per call",
            )
        self.previous = got
        out_blobs: list[bytes | memoryview] = []
        return {"outputs": encode_value(got, out_blobs), "warnings": warnings}, out_blobs

    def time(self, request: dict[str, Any], blobs: list[bytearray]) -> tuple[dict, list]:
        """``reps`` calls on the inputs, each after an L2 flush and a device-wide sync; the
        judge times the whole request with its own clock, and checks the last outputs."""
        import torch

        candidate = self._candidate()
        inputs = list(decode_value(request["inputs"], blobs, self.device))
        flush = _l2_flush(self.device)
        got: Any = None
        with torch.no_grad():
            for _ in range(int(request["reps"])):
                flush()
                got = candidate.model(*inputs)
                _synchronize(self.device)
        out_blobs: list[bytes | memoryview] = []
        return {"outputs": encode_value(got, out_blobs)}, out_blobs

    def _candidate(self) -> Candidate:
        if self.candidate is None:
            raise RuntimeError("the judge asked for a call before loading the candidate")
        return self.candidate

    def answer(self, header: dict[str, Any], blobs: list[bytearray]) -> None:
        op = header.get("op")
        out_blobs: list[bytes | memoryview] = []
        try:
            if op == "load":
                reply = self.load(header)
            elif op == "construct":
                reply = self.construct(header, blobs)
            elif op == "forward":
                reply, out_blobs = self.forward(header, blobs)
            elif op == "time":
                reply, out_blobs = self.time(header, blobs)
            else:
                raise RuntimeError(f"unknown request {op!r}")
        except VerificationFailure as failure:
            reply = {
                "failure": {
                    "rule": failure.rule,
                    "verdict": failure.verdict,
                    "summary": failure.summary,
                    "errors": failure.errors,
                }
            }
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            reply = {"raised": describe_exception(exc, str(self.workdir))}
        self.channel.send(
            {"ok": "failure" not in reply and "raised" not in reply, **reply}, out_blobs
        )


def describe_exception(exc: BaseException, workdir: str) -> dict[str, Any]:
    """What the judge needs to know of an exception the candidate raised: its readable
    traceback and how to classify it (the judge decides the verdict)."""
    chain = exception_chain(exc)
    tb = format_exception(exc, workdir)
    return {
        "traceback": tb,
        "last": tb[-1] if tb else type(exc).__name__,
        "kind": classify_exception(exc),
        "wrote_outside": wrote_outside(exc),
        "process_limit": any(isinstance(e, BlockingIOError) for e in chain),
        "memory": any(isinstance(e, MemoryError) for e in chain),
    }


def _check_inputs_unchanged(before: list[Any], after: list[Any]) -> None:
    import torch

    for i, ((_, a), (_, b)) in enumerate(
        zip(flatten(before, "input"), flatten(after, "input"), strict=True)
    ):
        if isinstance(a, torch.Tensor) and not torch.equal(a, b):
            raise rejected(
                "input_mutation",
                f"input mutation: the candidate modified input #{i} in place; kernels must "
                "not write to their inputs",
            )


def _l2_flush(device: str) -> Any:
    import torch

    if device != "cuda":
        return lambda: None
    buffer = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    return buffer.zero_


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()  # device-wide: side-stream work counts


def serve_judge(channel: Channel, workdir: Path, notes: list[str], refusal: str | None) -> None:
    """Answer the judge until it closes the channel, then exit at once (atexit handlers
    and interpreter teardown are the candidate's to abuse). ``notes``: what confining
    this process found missing; ``refusal``: why it could not be confined (it then loads
    nothing and says so)."""
    runner = _Runner(channel, workdir, notes, refusal)
    while True:
        try:
            header, blobs = channel.receive()
        except ChannelClosed:
            break
        runner.answer(header, blobs)
    os._exit(0)
