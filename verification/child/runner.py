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
from kernelflow.verification.child.build import build_extensions
from kernelflow.verification.child.candidate import Candidate
from kernelflow.verification.child.channel import (
    Channel,
    ChannelClosed,
    decode_value,
    encode_value,
)
from kernelflow.verification.child.device import (
    cold_copies,
    pin_cores,
    set_threads,
    synchronize,
)
from kernelflow.verification.child.guards import (
    LAUNCHES,
    LastOutputs,
    guarded_construction,
    os_threads,
    warm_up_thread_pools,
)
from kernelflow.verification.child.loading import clone, flatten, seed_all
from kernelflow.verification.child.profiling import NVTX_RANGE, profile_calls
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
        self.previous = LastOutputs()  # the last call's outputs
        self.staged: list[list[Any]] = []  # the inputs of timed calls, in copies
        self.turn = 0  # the copy the last timed call took
        self.timed = LastOutputs()  # the last timed call's outputs

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.refusal is not None:
            return {"unsupported": self.refusal}
        self.device = str(request["device"])
        dsl = backend(str(request["backend"]))
        # The judge's cores and threads: before any pool starts, so its threads inherit them.
        pin_cores([int(c) for c in request.get("cores") or []])
        set_threads(int(request.get("threads") or 0))
        try:
            dsl.use_prebuilt(str(self.workdir))
            dsl.start_runtime(self.device, LAUNCHES)
            for borrowed in dsl.borrows if dsl.counts_borrowed_launches else ():
                backend(borrowed).count_launches(LAUNCHES)
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

    def build(self, request: dict[str, Any]) -> dict[str, Any]:
        """Build each extension of the request with ``load_inline`` into this work dir,
        under the module name given: compiled here, as this process is confined as the
        candidate (the compiler reads the candidate's sources; the library's initialisers
        are the candidate's code)."""
        if self.refusal is not None:
            return {"unsupported": self.refusal}
        cores = [int(c) for c in request.get("cores") or []]
        if cores:  # the verifier's own cores: the compiler runs there, as many at once
            pin_cores(cores)
            os.environ["MAX_JOBS"] = str(len(cores))
        return {"errors": build_extensions(self.workdir, request["extensions"])}

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
        if not self.previous.take(got):
            raise rejected(
                "second_run",
                "forward() returned the memory of an earlier call's output (a cached or "
                "reused result); allocate a new output per call",
            )
        out_blobs: list[bytes | memoryview] = []
        return {"outputs": encode_value(got, out_blobs), "warnings": warnings}, out_blobs

    def stage(self, request: dict[str, Any], blobs: list[bytearray]) -> dict[str, Any]:
        """Keep the inputs the next timed batches run on (sent once, not with each batch),
        and the copies of them the calls take in turn (:func:`.device.cold_copies`)."""
        inputs = list(decode_value(request["inputs"], blobs, self.device))
        self.staged = cold_copies(inputs, self.device)
        self.timed = LastOutputs()
        return {}

    def time(self, request: dict[str, Any]) -> dict[str, Any]:
        """``reps`` calls on the staged inputs (the copies in turn), each followed by a
        device-wide sync; the judge times the whole request with its own clock, and asks
        for the last outputs after. Each call must return new memory: an output that is an
        earlier call's (a cached result) is refused, as in forward()."""
        import torch

        candidate = self._candidate()
        with torch.no_grad():
            for _ in range(int(request["reps"])):
                self.turn += 1
                got = candidate.model(*self.staged[self.turn % len(self.staged)])
                synchronize(self.device)
                if not self.timed.take(got):
                    raise rejected(
                        "second_run",
                        "forward() returned the memory of an earlier call's output while "
                        "timed (a cached or reused result); allocate a new output per call",
                    )
        return {}

    def profile(self, request: dict[str, Any]) -> dict[str, Any]:
        """``calls`` calls on the staged inputs under torch's profiler: the operators they
        ran (:func:`.profiling.profile_calls`), for the coder's ``profile_kernel``."""
        candidate = self._candidate()
        staged = self.staged

        def call() -> Any:
            self.turn += 1
            return candidate.model(*staged[self.turn % len(staged)])

        calls = int(request["calls"])
        found = profile_calls(call, self.device, calls, workdir=str(self.workdir), nvtx=NVTX_RANGE)
        return {"operators": found}

    def timed_outputs(self) -> tuple[dict, list]:
        """The outputs of the last timed call, for the judge to check."""
        out_blobs: list[bytes | memoryview] = []
        return {"outputs": encode_value(self.timed.value, out_blobs)}, out_blobs

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
            elif op == "build":
                reply = self.build(header)
            elif op == "construct":
                reply = self.construct(header, blobs)
            elif op == "forward":
                reply, out_blobs = self.forward(header, blobs)
            elif op == "stage":
                reply = self.stage(header, blobs)
            elif op == "time":
                reply = self.time(header)
            elif op == "profile":
                reply = self.profile(header)
            elif op == "ping":
                reply = {}
            elif op == "timed_outputs":
                reply, out_blobs = self.timed_outputs()
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
