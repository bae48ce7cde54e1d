"""Parent side of the verifier: check one candidate in a sandboxed child process.

This module runs inside the daemon and never imports or executes candidate code (nor torch:
initialising CUDA here would break forking and tie the daemon to the GPU). Before anything
runs, the candidate passes the static reward-hack gate (:mod:`kernelflow.verification.gate`).
Then each verification gets a private temp dir with ``job.json`` and runs the sandbox
process :mod:`kernelflow.verification.child` in the sandbox
(:mod:`kernelflow.sandbox`): by default forked from a warm process (torch and triton
already imported, CUDA never initialised) that lives in its own network namespace when the
machine allows it; the sandbox gets resource limits, its own PID namespace and the
``nobody`` user where possible, a wall-clock timeout that kills its whole process group,
and bounded output. Where mount namespaces work (probed once, ``SandboxPlan.fs_isolation``),
everything but its temp dir is read-only to it, so writes elsewhere fail at runtime
whatever the gate missed; elsewhere each report notes that the file system is not
isolated. ``VerifierConfig(warm=False)`` starts a fresh
``python -I -m kernelflow.verification.child WORKDIR`` instead. What the sandbox leaves
behind becomes the report in :mod:`kernelflow.verification.results`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from kernelflow.common.redact import scrub, secret_values
from kernelflow.events.model import VerificationReport
from kernelflow.sandbox import (
    ProcessOutcome,
    SandboxPlan,
    WarmKey,
    WarmProcessLost,
    detect_device,
    device_env,
    isolated_module,
    run_in_warm_process,
    run_process,
    sandbox_plan,
    shutdown_warm_processes,
    warm_process_for,
    warm_sandbox_plan,
)
from kernelflow.sandbox.process import read_tail
from kernelflow.sandbox.workdirs import VERIFY_PREFIX, locked_workdir
from kernelflow.verification.backends import DEFAULT_BACKEND, UnknownBackend, backend_names
from kernelflow.verification.backends import backend as find_backend
from kernelflow.verification.backends.extension import ExtensionSpec, wanted_extensions
from kernelflow.verification.child.compare import DEFAULT_TOLERANCES
from kernelflow.verification.child.remote import CANDIDATE_DIR
from kernelflow.verification.child.remote import OUTPUT_LOG as CANDIDATE_OUTPUT
from kernelflow.verification.extension_store import (
    DEFAULT_MAX_BYTES,
    ExtensionStore,
    fetch,
    share,
)
from kernelflow.verification.extensions import (
    Extension,
    build_locks,
    default_cache_dir,
    gpu_architecture,
    last_build_s,
    planned_extensions,
    record_build_s,
    record_failure,
    recorded_failure,
    toolchain,
    unbuilt,
)
from kernelflow.verification.extensions import install as extensions_install
from kernelflow.verification.extensions import store as extensions_store
from kernelflow.verification.gate import gate_findings
from kernelflow.verification.peaks import cached_peaks, peaks_key, record_peaks
from kernelflow.verification.policy import DEFAULT_POLICY, STRICT, Policy, UnknownPolicy
from kernelflow.verification.policy import policy as find_policy
from kernelflow.verification.results import feedback_text, interpret
from kernelflow.verification.shapes import (
    CPU_BUDGET,
    SizeBudget,
    auto_shape_sets,
    fallback_shape_sets,
)
from kernelflow.verification.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
)

__all__ = [
    "CHILD_MODULE",
    "VERIFIER_VERSION",
    "VerifierConfig",
    "check_reference",
    "checking_device",
    "detect_device",
    "offered_backends",
    "shutdown_warm_processes",
    "verify",
    "warm_up",
]

# The sandbox process: run as ``python -I -m CHILD_MODULE`` (see its ``__main__``).
CHILD_MODULE = "kernelflow.verification.child"
# What every report says judged it. Raise it whenever a change can turn a verdict (a gate
# rule, a runtime guard, inputs, tolerances, shapes): ``kernelflow reverify`` re-checks
# kernels whose newest check is older. 0 marks reports recorded before versions were.
# 2: a shape set the reference fails on is skipped whichever it is, and where that is
# every set the fallback sets are checked (a correct kernel was refused before).
# 3: strictness policies; gate rules that follow data and the Triton language (correct
# kernels written elsewhere were refused); the task's and the node's faults are verdicts
# of their own; tolerances scale with outputs near zero.
# 4: C++ (cpp) and KernelBench-format CUDA (cuda) backends; timing on the CPU for C++, on
# inputs no call finds cached, in batches of up to 1000 calls, after a last trial on the
# first shape set.
VERIFIER_VERSION = 4


@dataclass(frozen=True)
class VerifierConfig:
    timeout_s: float = 300.0
    memory_mb: int = 16384
    trials: int = 3
    # None: seeds no one can predict, drawn for every check (inputs and parameters); an
    # int makes a check reproducible, for debugging only (a known seed is a known input).
    seed: int | None = None
    max_output_bytes: int = 64_000
    python: str = sys.executable
    tolerances: dict[str, tuple[float, float]] | None = None  # None: DEFAULT_TOLERANCES
    # Size overrides of the task's module-level size constants, one dict per shape set
    # (the task module is executed afresh with them, so derived shapes follow); None: the
    # policy of ``shapes.auto_shape_sets`` (within ``cpu_budget`` on the CPU, and sets of
    # other sizes that catch shape-specialised code). ``({},)``: the task's own sizes only.
    shapes: tuple[dict[str, int], ...] | None = None
    cpu_budget: SizeBudget = CPU_BUDGET  # how large a shape set may be on the CPU
    static_gate: bool = True  # the AST reward-hack gate (disable only to test the sandbox)
    warm: bool = True  # fork from a warm process instead of starting a fresh interpreter
    device: str | None = None  # "cpu" / "cuda" to require one; None: whatever is here
    # The CUDA device (index or UUID) this verifier owns; its sandboxes see only that one
    # (``kernelflow daemon --gpus``: one verifier actor per device). None: all of them.
    gpu: str | None = None
    # Time candidate vs baseline where the backend's kernels are timed (``Backend.timed_on``:
    # Triton and CUDA on GPUs, C++ on the CPU).
    timing: bool = True
    # The most calls a timed batch makes (a batch is otherwise about 0.1 s of calls: the
    # request that runs it costs the candidate's side a round trip, spread over its calls).
    timing_reps: int = 1000
    # The threads candidate and baseline alike compute with (torch's and OpenMP's); None:
    # every core this process may use.
    threads: int | None = None
    # The cores judge and candidate both run on (os.sched_setaffinity); None: those this
    # process may use.
    cores: tuple[int, ...] | None = None
    # An inconclusive speedup (its interval holds 1, or spans more than a factor of 2) is
    # timed for more rounds, at most this many seconds more (and MAX_ROUNDS in all);
    # 0: never. A conclusive one after the first rounds costs nothing more.
    timing_extra_s: float = 10.0
    # Timings a node runs at once: verifiers of a data dir queue for one of its slots
    # around the timing phase only (``KF_TIMING_SLOTS``); 0: no queue. ``timing_lock_dir``
    # holds the slots' lock files and the node's peaks (:mod:`.peaks`) (the data dir's
    # ``timing``; None: a dir of this user's under the temp dir).
    timing_slots: int = 1
    timing_lock_dir: str | None = None
    # Compiled C++/CUDA extensions, shared by the verifiers of a node (None: a dir of this
    # user's under the temp dir); and how long building one candidate's may take.
    extension_cache: str | None = None
    compile_timeout_s: float = 300.0
    # The cluster's store of compiled extensions, behind ``extension_cache``
    # (:mod:`.extension_store`: a daemon's verifier actor gives one on NATS); None: the
    # disk cache alone. Entries over ``extension_share_max_bytes`` are neither put nor
    # fetched (``KF_EXTENSION_SHARE_MAX_MB``; 0: nothing is shared).
    shared_extensions: ExtensionStore | None = field(default=None, compare=False, repr=False)
    extension_share_max_bytes: int = DEFAULT_MAX_BYTES
    # Told before a candidate's C++/CUDA extensions are built (not found built): their
    # names, and how long the last build into the cache took (None: none yet), so that a
    # command can say why it is quiet for a minute (``kernelflow verify``).
    on_build: Callable[[list[str], float | None], None] | None = field(
        default=None, compare=False, repr=False
    )
    # An analysis the judge runs after the trials for a coder's tool (:mod:`.analysis`:
    # "roofline", "profile"; "": none), a command a fresh sandbox process (``warm=False``)
    # runs under (Nsight Compute's), and what reads the analysis job's work dir after it.
    analysis: str = ""
    wrapper: tuple[str, ...] = ()
    on_workdir: Callable[[Path], None] | None = field(default=None, compare=False, repr=False)
    baseline: str = "eager"  # or "compile" (torch.compile of the reference)
    # Time torch.compile of the reference too, as a second baseline (``kernelflow bench``).
    compare_compile: bool = False
    feedback_chars: int = 2000


DEFAULT_CONFIG = VerifierConfig()
# The judge's result is bounded well below this (it must fit in a pipe's buffer).
_MAX_RESULT_BYTES = 64 * 1024


def _sandbox_plan(config: VerifierConfig, device: str) -> SandboxPlan:
    """The sandbox plan of ``config``'s sandboxes on ``device`` (probed once): in forks of
    its warm process, or in fresh processes where each candidate gets one."""
    if config.warm:
        return warm_sandbox_plan(config.python, device, config.gpu, CHILD_MODULE, config.memory_mb)
    return sandbox_plan(config.python, device, config.memory_mb, CHILD_MODULE)


def _warm_key(config: VerifierConfig, device: str, prefix: tuple[str, ...]) -> WarmKey:
    """The warm process of ``config``'s sandboxes on ``device`` under network ``prefix``."""
    return WarmKey(config.python, device, prefix, config.gpu, CHILD_MODULE)


def checking_device(config: VerifierConfig = DEFAULT_CONFIG) -> str:
    """The device verifications under ``config`` run on here: "cpu", "cuda", or "" when
    ``config`` asks for a device this machine lacks."""
    device = detect_device(config.python, config.gpu)
    if config.device == "cuda" and device != "cuda":
        return ""
    return config.device or device


def warm_up(config: VerifierConfig = DEFAULT_CONFIG) -> str:
    """Do now what the first verification under ``config`` would otherwise do first: find
    the device, probe the sandbox and start the warm process (seconds of importing torch
    and triton each). What was readied, in words.

    A daemon's verifier calls this as it starts, so that its first candidate, which comes
    only after the designer's and coder's LLM calls, waits for none of it. Raises what
    those steps raise (no python with torch, a warm process that cannot start): the
    verification would then report the same problem itself. Call it from a thread that
    outlives the verifications: the warm process dies with the thread that started it (Linux
    sends PR_SET_PDEATHSIG when that thread ends). Verifiers of a pool that
    share a configuration probe once and share the warm process: each step is done once, and
    a verification that asks meanwhile waits for it."""
    device = detect_device(config.python, config.gpu)
    if config.device == "cuda" and device != "cuda":
        return "nothing to ready: no CUDA GPU here, every verification answers unsupported"
    if config.device == "cpu":
        device = "cpu"
    plan = _sandbox_plan(config, device)
    if config.warm:  # up already, unless no isolation worked (then this says why)
        warm_process_for(_warm_key(config, device, plan.prefix))
    return f"{device}, " + ("warm process up" if config.warm else "a fresh sandbox per candidate")


def verify(
    task_source: str,
    candidate_source: str,
    *,
    backend: str = DEFAULT_BACKEND,
    policy: str = DEFAULT_POLICY,
    config: VerifierConfig = DEFAULT_CONFIG,
) -> VerificationReport:
    """Check ``candidate_source`` (defines ModelNew) against ``task_source`` (defines Model)
    under the strictness ``policy`` (:mod:`.policy`).

    Never raises for problems of the candidate or the task: every outcome is a report.
    """
    started = time.perf_counter()
    device = detect_device(config.python, config.gpu)
    warnings: list[str] = []
    try:
        try:
            judged_by = find_policy(policy)
        except UnknownPolicy as exc:
            raise _Refused("task_error", str(exc)) from None
        try:
            check_candidate_source(candidate_source)
        except CandidateError as exc:
            raise _Refused("compile_error", str(exc)) from None
        device = _device_to_run(backend, device, config)
        warnings = _check_statically(task_source, candidate_source, backend, judged_by, config)
        report = _run_sandboxed(task_source, candidate_source, backend, device, judged_by, config)
    except _Refused as refused:
        report = refused.report
    if report.passed:
        report = msgspec.structs.replace(report, warnings=[*warnings, *report.warnings])
    report = scrubbed(report)
    tolerances = config.tolerances or DEFAULT_TOLERANCES
    return msgspec.structs.replace(
        report,
        device=device,
        backend=backend,
        duration_s=time.perf_counter() - started,
        feedback=feedback_text(report, config.feedback_chars),
        verifier_version=VERIFIER_VERSION,
        checks=report.checks or checks_on(config, None),
        policy=policy,
        tolerances={dtype: list(pair) for dtype, pair in sorted(tolerances.items())},
    )


def checks_on(config: VerifierConfig, plan: SandboxPlan | None) -> list[str]:
    """The anti-cheat checks a verification under ``config`` had on (``plan``: the
    sandbox it ran in, None when it ended before one ran), for reports and benchmark cards."""
    checks = ["static_gate"] if config.static_gate else []
    # Always: the candidate's process only produces outputs, the judge decides; inputs
    # beyond get_inputs() (signs, edges) and a check that outputs follow the inputs;
    # guards against torch compute, threads and patching inside the candidate's process.
    checks += ["judge_isolation", "varied_inputs", "runtime_guards"]
    checks.append("secret_seeds" if config.seed is None else "fixed_seed")
    if config.shapes is None:
        checks.append("shape_sets")
    if plan is not None:
        checks += [
            name
            for name, on in (
                ("fs_isolation", plan.fs_isolation),
                ("network_isolation", plan.network_isolated),
            )
            if on
        ]
    return checks


def scrubbed(report: VerificationReport) -> VerificationReport:
    """``report`` with every credential removed from its texts: they carry what the
    candidate printed and raised, and go into the log and the coder's next prompt."""
    secrets = secret_values()
    return msgspec.structs.replace(
        report,
        summary=scrub(report.summary, secrets),
        errors=[scrub(e, secrets) for e in report.errors],
        reasons=[scrub(r, secrets) for r in report.reasons],
        warnings=[scrub(w, secrets) for w in report.warnings],
        mismatches=[scrub(m, secrets) for m in report.mismatches],
    )


class _Refused(Exception):
    """A verification that ends before (or instead of) running its sandbox."""

    def __init__(
        self,
        verdict: str,
        summary: str,
        errors: list[str] | None = None,
        reasons: list[str] | None = None,
    ) -> None:
        super().__init__(summary)
        self.report = VerificationReport(
            verdict=verdict,  # type: ignore[arg-type]
            summary=summary,
            errors=errors if errors is not None else [summary],
            reasons=reasons if reasons is not None else [f"{verdict}: {summary}"],
        )


def _device_to_run(backend: str, device: str, config: VerifierConfig) -> str:
    """Where a candidate of ``backend`` runs, ``device`` being what this machine has;
    refused ``unsupported`` if it cannot run here."""
    try:
        dsl = find_backend(backend)
    except UnknownBackend:
        supported = ", ".join(backend_names())
        raise _Refused(
            "unsupported", f"backend {backend!r} is unsupported (supported: {supported})"
        ) from None
    if config.device == "cuda" and device != "cuda":
        where = f"GPU {config.gpu} is not visible" if config.gpu else "no CUDA GPU"
        raise _Refused("unsupported", f"device 'cuda' is unsupported here ({where})")
    if dsl.needs_gpu and device != "cuda":
        raise _Refused(
            "unsupported", f"backend {backend!r} is unsupported on this device (no CUDA GPU)"
        )
    if config.device == "cpu" and device != "cpu":
        # A GPU machine asked to check on the CPU: only a backend that runs there.
        if dsl.needs_gpu:
            raise _Refused("unsupported", f"backend {backend!r} cannot run on the CPU")
        return "cpu"
    return device


def _check_statically(
    task_source: str, candidate_source: str, backend: str, policy: Policy, config: VerifierConfig
) -> list[str]:
    """The task must be a usable reference, the candidate pass the reward-hack gate under
    ``policy``; what the policy lets pass but records (warnings)."""
    try:
        check_task_source(task_source, "task.py")
    except TaskFileError as exc:
        raise _Refused("task_error", str(exc), reasons=[f"task_error: {exc}"]) from None
    if not config.static_gate:
        return []
    violations, warnings = gate_findings(
        candidate_source, backend=backend, task_source=task_source, policy=policy.name
    )
    if violations:
        # The summary quotes the first finding (the root cause: gate.feedback) as the
        # reasons and the coder's feedback say it, word for word.
        raise _Refused(
            "rejected_static",
            f"static check: {violations[0].text()}"
            + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
            errors=[v.text() for v in violations[:10]],
            reasons=[v.text() for v in violations],
        )
    return [v.text() for v in warnings]


def offered_backends(device: str) -> list[str]:
    """The backends a verifier on ``device`` ("cpu" or "cuda"; "" for none) can check."""
    if not device:
        return []
    return [
        name for name in backend_names() if device == "cuda" or not find_backend(name).needs_gpu
    ]


def check_reference(
    task_source: str, *, backend: str = DEFAULT_BACKEND, config: VerifierConfig = DEFAULT_CONFIG
) -> VerificationReport:
    """Whether ``task_source``'s reference runs, in the sandbox, on the shape sets a
    verification of a ``backend`` candidate under ``config`` would check: verdict
    ``pass``, or ``task_error`` saying how it fails (``unsupported`` when this node cannot
    run the check). What ``submit`` and ``run`` ask before a task is published, so that no
    LLM call is spent on a task that cannot be checked. Never raises for the task's
    problems."""
    started = time.perf_counter()
    device = detect_device(config.python, config.gpu)
    try:
        device = _device_to_run(backend, device, config)
        try:
            check_task_source(task_source, "task.py")
        except TaskFileError as exc:
            raise _Refused("task_error", str(exc), reasons=[f"task_error: {exc}"]) from None
        reference_only = dataclasses.replace(config, trials=1, timing=False)
        report = _run_sandboxed(task_source, None, backend, device, STRICT, reference_only)
    except _Refused as refused:
        report = refused.report
    return msgspec.structs.replace(
        scrubbed(report),
        device=device,
        backend=backend,
        duration_s=time.perf_counter() - started,
        verifier_version=VERIFIER_VERSION,
    )


def _run_sandboxed(
    task_source: str,
    candidate_source: str | None,
    backend: str,
    device: str,
    policy: Policy,
    config: VerifierConfig,
) -> VerificationReport:
    """Run the check in a sandbox (forked from the warm process, or a fresh process) in a
    locked work dir of its own; the report made of what it left behind. Without a
    candidate, the job checks only that the reference runs. A candidate's C++/CUDA
    extensions are built first, by a build job under a time limit of its own (or found in
    the cache), and handed to the check built."""
    shapes = (
        [dict(s) for s in config.shapes]
        if config.shapes is not None
        else auto_shape_sets(task_source, device, config.cpu_budget)
    )
    plan = _sandbox_plan(config, device)
    if plan.refusal:
        raise _Refused("unsupported", plan.refusal)
    cores = sorted(config.cores) if config.cores else _usable_cores()
    threads = config.threads or len(cores)
    lock_dir = _timing_lock_dir(config)
    key = peaks_key(device, config.gpu, threads, cores)
    wanted = wanted_extensions(candidate_source) if candidate_source is not None else []
    extensions = _built_extensions(wanted, candidate_source or "", device, plan, config, cores)
    job = {
        "reference_only": candidate_source is None,
        "task_file": "task.py",
        "candidate_file": "candidate.py",
        "trials": config.trials,
        "seed": config.seed,
        "device": device,
        "backend": backend,
        "shapes": shapes,
        "auto_shapes": config.shapes is None,
        "fallback_shapes": (
            fallback_shape_sets(task_source, device, config.cpu_budget)
            if config.shapes is None
            else []
        ),
        "tolerances": config.tolerances or DEFAULT_TOLERANCES,
        "timing": config.timing and device in find_backend(backend).timed_on,
        "timing_reps": config.timing_reps,
        "timing_extra_s": config.timing_extra_s,
        "timing_slots": config.timing_slots,
        "timing_lock_dir": lock_dir,
        "timing_slot_group": timing_slot_group(device, config.gpu),
        "timeout_s": config.timeout_s,
        "cores": cores,
        "threads": threads,
        # The machine's peaks this node measured before (:mod:`.peaks`).
        "peaks_key": key,
        "peaks": cached_peaks(lock_dir, key),
        "analysis": config.analysis,
        "baseline": config.baseline,
        "compare_compile": config.compare_compile,
        # What the candidate's process records instead of refusing (the policy's).
        "warned_rules": sorted(policy.warned),
    }
    return _run_job(
        job,
        task_source,
        candidate_source,
        plan,
        config,
        config.timeout_s,
        prepare=lambda cand_dir: extensions_install(extensions, cand_dir),
    )


def _built_extensions(
    wanted: list[ExtensionSpec],
    candidate_source: str,
    device: str,
    plan: SandboxPlan,
    config: VerifierConfig,
    cores: list[int],
) -> list[Extension]:
    """The candidate's extensions, built: those the disk cache lacks are fetched from the
    cluster's store (``config.shared_extensions``), or else built by a build job on
    ``cores`` (the compiler's errors refuse the candidate as ``compile_error``), cached
    and shared."""
    if not wanted:
        return []
    cache_dir = Path(config.extension_cache) if config.extension_cache else default_cache_dir()
    # A CUDA build is for the GPU it is built on (the build job sees the verifier's only).
    gpu = gpu_architecture(config.python, config.gpu) if any(s.cuda_sources for s in wanted) else ""
    extensions = planned_extensions(wanted, cache_dir, toolchain(config.python), gpu)
    if not unbuilt(extensions):
        return extensions
    failed = recorded_failure(unbuilt(extensions))
    if failed is not None:  # this source failed to compile here before: the same errors
        raise _Refused("compile_error", failed["summary"], failed["errors"], failed["reasons"])
    max_bytes = config.extension_share_max_bytes
    shared = config.shared_extensions if max_bytes > 0 else None
    with build_locks(extensions):
        missing = unbuilt(extensions)  # another verifier may have built them meanwhile
        if missing and shared is not None:
            missing = fetch(missing, shared, max_bytes)
        if not missing:
            return extensions
        if config.on_build is not None:
            config.on_build([e.spec.name for e in missing], last_build_s(cache_dir))
        building = time.perf_counter()
        job = {
            "build": [e.job_entry() for e in missing],
            "candidate_file": "candidate.py",
            "device": device,
            "cores": cores,
        }
        report = _run_job(
            job,
            "",
            candidate_source,
            plan,
            config,
            config.compile_timeout_s,
            keep=lambda cand_dir: extensions_store(missing, cand_dir / "extensions"),
        )
    if report.verdict == "timeout":
        summary = f"building the extensions took longer than {config.compile_timeout_s:g} s"
        raise _Refused("compile_error", summary)
    if not report.passed:
        if report.verdict == "compile_error":
            record_failure(missing, report.summary, report.errors, report.reasons)
        raise _Refused(report.verdict, report.summary, report.errors, report.reasons)
    if still := unbuilt(extensions):
        raise _Refused("compile_error", f"the extension {still[0].spec.name!r} was not built")
    record_build_s(cache_dir, time.perf_counter() - building)
    if shared is not None:  # after the lock: the node's other verifiers find it on disk
        share(missing, shared, max_bytes)
    return extensions


def _run_job(
    job: Mapping[str, object],
    task_source: str,
    candidate_source: str | None,
    plan: SandboxPlan,
    config: VerifierConfig,
    timeout_s: float,
    *,
    prepare: Callable[[Path], None] | None = None,
    keep: Callable[[Path], None] | None = None,
) -> VerificationReport:
    """Run ``job`` in a sandbox in a fresh work dir holding the task and the candidate
    (``prepare``: more for the candidate's dir, before it runs; ``keep``: what to take from
    the candidate's dir after, before the work dir goes)."""
    device = str(job["device"])
    with locked_workdir(VERIFY_PREFIX) as workdir:
        Path(workdir, "task.py").write_text(task_source)
        # The candidate's process works in a dir of its own and sees nothing else of these.
        cand_dir = Path(workdir, CANDIDATE_DIR)
        cand_dir.mkdir()
        if candidate_source is not None:
            (cand_dir / "candidate.py").write_text(candidate_source)
        if prepare is not None:
            prepare(cand_dir)
        sandbox = {
            "memory_kind": plan.memory_kind,
            "fs_isolation": plan.fs_isolation,
            "sandbox_notes": list(plan.notes),
            "memory_mb": config.memory_mb,
        }
        Path(workdir, "job.json").write_text(json.dumps({**job, **sandbox}))
        try:
            if config.warm:
                key = _warm_key(config, device, plan.prefix)
                outcome = run_in_warm_process(key, workdir, timeout_s, config.max_output_bytes)
            else:
                outcome = _run_fresh(plan, device, workdir, config, timeout_s)
        except (OSError, WarmProcessLost) as exc:  # the node's fault, not the candidate's
            raise _Refused("unsupported", f"could not run the sandbox: {exc}") from None
        if "peaks_key" in job:
            record_peaks(str(job["timing_lock_dir"]), str(job["peaks_key"]), workdir)
        if job.get("analysis") and config.on_workdir is not None:
            config.on_workdir(Path(workdir))
        printed = read_tail(cand_dir / CANDIDATE_OUTPUT, config.max_output_bytes)
        report = interpret(outcome, workdir, timeout_s, printed)
        if keep is not None and report.passed:
            keep(cand_dir)
        return msgspec.structs.replace(report, checks=checks_on(config, plan))


def timing_slot_group(device: str, gpu: str | None) -> str:
    """The timing slots a check on ``device`` queues for (``child.slot``): one set per
    device timed on. The CPU's are the node's, whatever cores a verifier owns (they
    share the caches and the memory's bandwidth: ``KF_TIMING_SLOTS`` lets as many time
    at once); a GPU's are that GPU's (``gpu``, as the verifier owns it; "" for a
    verifier that owns none)."""
    return "cpu" if device == "cpu" else f"cuda{gpu or ''}"


def _usable_cores() -> list[int]:
    """The cores this process may run on (its affinity; every core of the machine
    elsewhere)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _timing_lock_dir(config: VerifierConfig) -> str:
    """Where the node's timing slots are (created here: the judge may not create it)."""
    directory = config.timing_lock_dir or str(
        Path(tempfile.gettempdir(), f"kernelflow-timing-{os.getuid()}")
    )
    with contextlib.suppress(OSError):  # the judge then times without a slot
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def _run_fresh(
    plan: SandboxPlan, device: str, workdir: str, config: VerifierConfig, timeout_s: float
) -> ProcessOutcome:
    """The naive path: a fresh interpreter for this one check, its result on a pipe."""
    env = device_env(workdir, device, config.gpu)
    env["TRITON_CACHE_DIR"] = str(Path(workdir, ".triton", "cache"))
    result_r, result_w = os.pipe()
    try:
        args = (workdir, "--result-fd", str(result_w))
        cmd = [*plan.prefix, *config.wrapper, *isolated_module(config.python, CHILD_MODULE, *args)]
        outcome = run_process(
            cmd, workdir, env, timeout_s, config.max_output_bytes, pass_fds=(result_w,)
        )
    finally:
        os.close(result_w)
    os.set_blocking(result_r, False)
    with os.fdopen(result_r, "rb") as pipe:
        try:
            result = pipe.read(_MAX_RESULT_BYTES) or b""
        except BlockingIOError:  # a process the candidate left behind holds the pipe open
            result = b""
    return dataclasses.replace(outcome, result=result)
