"""The judge's handle on the candidate's process: forking it (into a PID namespace of its
own, where the machine allows one, so it cannot see, signal or trace the judge), and the
requests the judge makes of it (:mod:`.runner` answers them).

The candidate's process is forked before the judge reads the task or draws a seed, keeps
no file descriptor but its end of the channel, and confines itself before any candidate
code runs. Everything it answers is a claim: the judge decodes outputs as data and judges
them itself (:mod:`.judge`).

Child side: stdlib at module level.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.sandbox import (
    SandboxUnavailable,
    confine_candidate,
    network_opted_in,
    unshare_pid_namespace,
)
from kernelflow.sandbox.limits import die_with_parent
from kernelflow.verification.backends import DEFAULT_BACKEND, UnknownBackend, backend
from kernelflow.verification.child.channel import (
    Channel,
    ChannelClosed,
    ChannelError,
    decode_value,
    encode_value,
    tensor_facts,
)
from kernelflow.verification.child.profiling import TOP_OPERATORS
from kernelflow.verification.child.report import VerificationFailure

__all__ = [
    "CANDIDATE_DIR",
    "CandidateDied",
    "CandidateRaised",
    "RemoteCandidate",
    "Unsupported",
    "start_candidate",
]

CANDIDATE_DIR = "candidate"  # the candidate's own work dir, inside the job's
OUTPUT_LOG = "output.log"  # the candidate process's stdout and stderr, in its work dir
# What the candidate may send in one answer beyond the size of what it was asked about.
_ANSWER_SLACK_BYTES = 1 << 20
_OUTPUT_TAIL_BYTES = 16 * 1024
# Warnings one answer may carry (what the candidate's process says is bounded too).
_MAX_WARNINGS = 8
_MAX_WARNING_CHARS = 300


class CandidateRaised(Exception):
    """The candidate's code raised; ``info`` describes it (see ``runner.describe_exception``)."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(str(info.get("last", "")))
        self.info = info


class CandidateDied(Exception):
    """The candidate's process ended while the judge waited for an answer."""

    def __init__(self, how: str, output: str) -> None:
        super().__init__(how)
        self.how = how
        self.output = output  # the tail of what it printed


class Unsupported(Exception):
    """The backend's runtime cannot start in the candidate's process."""


@dataclass
class Answer:
    outputs: Any  # decoded on the judge's device
    facts: list[tuple[str, dict[str, Any]]]  # each tensor output's class and device, as sent
    # What the call did that the policy records instead of refusing ("rule: what").
    warnings: list[str]


class RemoteCandidate:
    """Requests to the candidate's process; every failure it reports is raised here as
    :class:`~.report.VerificationFailure` (a guard refused it), :class:`CandidateRaised`
    or :class:`CandidateDied`."""

    def __init__(self, channel: Channel, pid: int, workdir: Path, output_fd: int) -> None:
        self.channel = channel
        self.pid = pid  # the reaper's, which ends as the candidate's process does
        self.workdir = workdir
        # The candidate's log, opened for reading before it existed: the file becomes
        # the candidate's user's, unreadable to the judge by name.
        self.output_fd = output_fd
        # What the candidate's process says of its confinement when it has loaded.
        self.notes: list[str] = []

    def load(
        self,
        candidate_file: str,
        backend: str,
        device: str,
        name: str,
        warned_rules: list[str] | None = None,
        threads: int = 0,
        cores: list[int] | None = None,
    ) -> bool:
        """Import the candidate module; whether it defines ``ModelNew``. ``warned_rules``:
        the guards' rules whose findings the policy records instead of refusing;
        ``threads``: how many threads it computes with (0: the default); ``cores``: the
        cores it runs on (the judge's; none: wherever it may)."""
        reply, _ = self._ask(
            {
                "op": "load",
                "candidate_file": candidate_file,
                "backend": backend,
                "device": device,
                "name": name,
                "warned_rules": list(warned_rules or []),
                "threads": threads,
                "cores": list(cores or []),
            },
            [],
        )
        if "unsupported" in reply:
            raise Unsupported(str(reply["unsupported"]))
        self.notes = [str(note) for note in reply.get("notes") or []]
        return bool(reply.get("has_model"))

    def build(
        self, extensions: list[dict[str, Any]], device: str, cores: list[int] | None = None
    ) -> list[str]:
        """Build the extensions the module asks ``load_inline`` for (``extensions``: their
        specs and the module names to build them under) into the candidate's work dir, on
        ``cores`` (the verifier's; none: wherever it may); the compiler's errors,
        shortened (empty: all built)."""
        request = {"op": "build", "extensions": extensions, "device": device}
        reply, _ = self._ask({**request, "cores": list(cores or [])}, [])
        return [str(e) for e in reply.get("errors") or []]

    def construct(self, init_inputs: Any, seed: int) -> None:
        """``ModelNew(*init_inputs)`` after seeding its RNG with ``seed``."""
        blobs: list[bytes | memoryview] = []
        self._ask(
            {"op": "construct", "seed": seed, "init": encode_value(init_inputs, blobs)}, blobs
        )

    def forward(
        self, inputs: list[Any], device: str, expected_bytes: int, inputs_may_change: bool
    ) -> Answer:
        """One guarded forward() call on (copies of) ``inputs``; unless
        ``inputs_may_change`` (the reference itself writes to them), a call that changes
        them is refused."""
        request = {"op": "forward", "inputs_may_change": inputs_may_change}
        return self._call(request, inputs, device, expected_bytes)

    def stage(self, inputs: list[Any]) -> None:
        """Send the inputs the timed batches run on (once: no batch's time holds their
        transfer)."""
        blobs: list[bytes | memoryview] = []
        self._ask({"op": "stage", "inputs": encode_value(list(inputs), blobs)}, blobs)

    def time(self, reps: int) -> None:
        """``reps`` calls on the staged inputs (the caller times the request)."""
        self._ask({"op": "time", "reps": reps}, [])

    def ping(self) -> None:
        """A request that does nothing: the round trip a timed batch's request costs
        (waking the candidate's process, and this one when it answers), for the
        baseline's batches to carry too."""
        self._ask({"op": "ping"}, [])

    def profile(self, calls: int) -> list[dict[str, Any]]:
        """The operators ``calls`` calls on the staged inputs ran, by torch's profiler in
        the candidate's process (:func:`.profiling.profile_calls`): its claims, bounded
        here, shown to the coder and never part of a verdict."""
        reply, _ = self._ask({"op": "profile", "calls": calls}, [])
        rows = reply.get("operators")
        if not isinstance(rows, list):
            return []
        return [
            {
                "name": str(row.get("name", ""))[:120],
                **{key: _number(row.get(key)) for key in ("self_ms", "calls", "share")},
            }
            for row in rows[:TOP_OPERATORS]
            if isinstance(row, dict)
        ]

    def timed_outputs(self, device: str, expected_bytes: int) -> Answer:
        """The outputs of the last timed call."""
        return self._call({"op": "timed_outputs"}, None, device, expected_bytes)

    def _call(
        self, request: dict[str, Any], inputs: list[Any] | None, device: str, expected_bytes: int
    ) -> Answer:
        blobs: list[bytes | memoryview] = []
        if inputs is not None:
            request["inputs"] = encode_value(list(inputs), blobs)
        # An answer may not be much larger than the reference's own outputs.
        self.channel.max_bytes = 4 * expected_bytes + _ANSWER_SLACK_BYTES
        reply, got = self._ask(request, blobs)
        try:
            outputs = decode_value(reply.get("outputs"), got, device)
        except ChannelError as exc:
            raise VerificationFailure(
                f"the candidate's outputs could not be read: {exc}",
                [f"the candidate's outputs could not be read: {exc}"],
                verdict="rejected_runtime",
                rule="output_type",
            ) from None
        warnings = [str(w)[:_MAX_WARNING_CHARS] for w in reply.get("warnings") or []]
        return Answer(outputs, tensor_facts(reply.get("outputs")), warnings[:_MAX_WARNINGS])

    def _ask(
        self, request: dict[str, Any], blobs: list[bytes | memoryview]
    ) -> tuple[dict[str, Any], list[bytearray]]:
        try:
            self.channel.send(request, blobs)
            reply, got = self.channel.receive()
        except (ChannelClosed, BrokenPipeError, ConnectionResetError):
            raise CandidateDied(self._end(), self.output_tail()) from None
        except ChannelError as exc:
            raise VerificationFailure(
                f"the candidate's process broke the protocol: {exc}",
                [f"the candidate's process broke the protocol: {exc}"],
                verdict="rejected_runtime",
                rule="tampering",
            ) from None
        failure = reply.get("failure")
        if isinstance(failure, dict):
            raise VerificationFailure(
                str(failure.get("summary", "")),
                [str(e) for e in failure.get("errors") or []],
                verdict="rejected_runtime",  # all a guard may say: it refused the candidate
                rule=str(failure.get("rule", "runtime")),
            )
        raised = reply.get("raised")
        if isinstance(raised, dict):
            raise CandidateRaised(raised)
        return reply, got

    def _end(self) -> str:
        """How the candidate's process ended (it closed the channel): reaped here."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return "the candidate's process ended"
        if os.WIFSIGNALED(status):
            try:
                name = signal.Signals(os.WTERMSIG(status)).name
            except ValueError:
                name = f"signal {os.WTERMSIG(status)}"
            return f"the candidate's process was killed by {name}"
        return f"the candidate's process exited with status {os.WEXITSTATUS(status)}"

    def output_tail(self) -> str:
        """The end of what the candidate's process printed (its own words: bounded here,
        scrubbed by the parent)."""
        try:
            size = os.fstat(self.output_fd).st_size
            start = max(0, size - _OUTPUT_TAIL_BYTES)
            said = os.pread(self.output_fd, size - start, start).decode("utf-8", "replace")
        except OSError:
            return ""
        return said.replace(str(self.workdir).rstrip("/") + "/", "")  # "candidate.py"

    def close(self) -> None:
        """End the candidate's process: it exits when the channel closes; killed if not."""
        with contextlib.suppress(OSError):
            self.channel.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.output_fd)


def _number(value: Any) -> float:
    """A figure the candidate's process claims: a finite number, else 0."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return 0.0


def start_candidate(workdir: Path, job: dict[str, Any]) -> RemoteCandidate:
    """Fork the candidate's process for the job in ``workdir`` (its own work dir is
    ``workdir / CANDIDATE_DIR``). Call first thing in the judge's process: it holds
    nothing yet the candidate could find in the copy of its memory it is forked with.

    The fork goes through a reaper: a process that moves its children into a new PID
    namespace (the judge cannot itself: a process whose children go to another namespace
    may start no more threads, and the reference needs its thread pools), forks the
    candidate's process there and ends as it ends."""
    cand_dir = workdir / CANDIDATE_DIR
    judge_end, candidate_end = socket.socketpair()
    log = cand_dir / OUTPUT_LOG
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    output_fd = os.open(log, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    judge = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            judge_end.close()
            _reap_candidate(candidate_end, cand_dir, job, judge)
        finally:
            os._exit(70)
    candidate_end.close()
    return RemoteCandidate(Channel(judge_end, 0), pid, cand_dir, output_fd)


def _reap_candidate(sock: socket.socket, cand_dir: Path, job: dict[str, Any], judge: int) -> None:
    """The reaper (the ``judge``'s child): fork the candidate's process into a new PID
    namespace (where the machine allows one), keep nothing else, and end as it ends.
    Never returns."""
    die_with_parent(judge)
    # Where refused, the candidate's confinement notes it.
    in_new_namespace = unshare_pid_namespace()
    keep = sock.fileno()
    os.closerange(3, keep)  # the judge's result pipe above all
    os.closerange(keep + 1, 65536)
    # The reaper as the candidate will see it: outside its PID namespace, a parent is 0.
    reaper = 0 if in_new_namespace else os.getpid()
    child = os.fork()
    if child == 0:
        _become_candidate(sock, cand_dir, job, reaper)
    sock.close()
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def _become_candidate(
    sock: socket.socket, cand_dir: Path, job: dict[str, Any], reaper: int
) -> None:
    """In the forked process: keep only the channel, print into its own log, confine
    itself, then answer the judge. Never returns."""
    from kernelflow.verification.child.runner import serve_judge

    die_with_parent(reaper)
    # A session of its own: kill(0, ...) (the process group) reaches none of the judge's.
    os.setsid()
    keep = sock.fileno()
    log = os.open(cand_dir / OUTPUT_LOG, os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # Nothing of the judge's (its result pipe, its logs) stays reachable.
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    faulthandler.enable()
    # The backend (a plugin, maybe) is found and imported while its files are in view.
    with contextlib.suppress(UnknownBackend):
        backend(str(job.get("backend", DEFAULT_BACKEND)))
    try:
        notes = confine_candidate(
            cand_dir,
            memory_kind=str(job.get("memory_kind", "as")),
            memory_mb=int(job.get("memory_mb", 0)),
            allow_network=network_opted_in(),
        )
        refusal = None
    except SandboxUnavailable as exc:  # half-confined: it answers, it runs nothing
        notes, refusal = [], exc.reason
    die_with_parent(reaper)  # again: a change of user clears the request
    max_input_bytes = int(job.get("max_input_bytes", 1 << 34))
    serve_judge(Channel(sock, max_input_bytes), cand_dir, notes, refusal)
