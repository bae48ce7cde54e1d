"""Commands and events: the whole vocabulary of kernelflow.

Every type is a frozen msgspec Struct in a tagged union. The tag (``kind``) is an explicit,
stable wire string, never a class name, and every message carries a schema version ``v``.
Evolution rule: only ever add optional fields; never rename or retype one. A change that
cannot follow it raises that kind's ``v`` and registers an upcaster from the old version
(``kernelflow.events.codec.upcaster``). An event of a kind this version does not know (a
newer kernelflow wrote it) decodes as an ``UnknownEvent`` that every projection skips.

Events share an envelope: the task they belong to, their position in that task's history
(``seq``, 1-based, gap-free), the wall time they were recorded and the id of what caused
them (another event's id, or a command id). ``seq`` and ``at`` are stamped by the EventLog
at append time; code that produces events leaves them at their defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

SCHEMA_VERSION = 1

# Task ids become a NATS subject token, so they are restricted to a safe alphabet.
TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
TaskId = Annotated[str, msgspec.Meta(pattern=TASK_ID_PATTERN)]
# What a backend name may be on the wire; which names exist is the backend registry's
# (kernelflow.verification.backends, whose NAME_PATTERN must equal this one: tested).
BACKEND_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"

# The verifier's verdicts. "fail" and "error" are legacy values: events recorded before the
# finer vocabulary still decode, but the verifier no longer produces them.
Verdict = Literal[
    "pass",
    "compile_error",
    "runtime_error",
    "timeout",
    "mismatch",
    "rejected_static",
    "rejected_runtime",
    "unsupported",
    "task_error",
    "fail",
    "error",
]
# Verdicts that are not the candidate's doing: ``task_error`` (the task's fault: its
# reference fails on its own inputs, its shapes cannot be built) and ``unsupported`` (the
# node's: a backend or device it lacks, a sandbox it cannot start). A task that meets one
# ends there, with no coder retry and no LLM call, and no reward is the policy's
# (docs/verifier.md, "Whose fault").
FAULT_VERDICTS = frozenset({"task_error", "unsupported"})
# What a strictness policy may be called on the wire; which names exist is the verifier's
# registry (kernelflow.verification.policy).
POLICY_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
PolicyName = Annotated[str, msgspec.Meta(pattern=POLICY_NAME_PATTERN)]
TaskStatus = Literal["success", "failed", "cancelled", "rejected", "budget_exceeded", "timeout"]
DecisionMode = Literal["auto", "llm", "retry", "limit", "fallback"]


# --------------------------------------------------------------------------- commands


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Something a publisher asks for on ``kf.cmd.*``. Commands may be refused."""

    v: int = SCHEMA_VERSION


class VerifyLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a task asks of its verifications instead of the verifier's defaults (a reward
    request's ``trials`` and ``timeout_s``: kernelflow.rewards). Unset: the verifier's."""

    trials: Annotated[int, msgspec.Meta(ge=1, le=20)] | None = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None
    # False: not timed (a reward that does not read the speedup needs no timing).
    timing: bool | None = None


class PriorKernel(msgspec.Struct, frozen=True, kw_only=True):
    """A kernel an earlier task of a search wrote, shown to this task's coder: a ``parent``
    to improve, or an ``inspiration`` to learn from (``kernelflow.search``). Recorded with
    the task, so its prompt never depends on reading another task."""

    task_id: str
    role: Literal["parent", "inspiration"]
    code: str
    verdict: str
    speedup: float | None = None
    feedback: str = ""  # what the verifier told its author
    candidate_ms: float | None = None  # its median time on a GPU
    # False: its speedup was inconclusive (the prompt says so instead of the number).
    speedup_conclusive: bool | None = None


class SubmitTask(Command, tag="submit_task", frozen=True, kw_only=True):
    """Submit a reference PyTorch model (KernelBench format) to be turned into a kernel.

    ``task_id`` is optional: a publisher that sets it can watch ``kf.ev.<task_id>.>`` right
    away and resubmitting the same id is a no-op. Without it the daemon derives one from
    the command's position in the command stream.
    """

    task_source: str
    task_name: str = ""
    task_id: TaskId | None = None
    # v2 names the workflow ``workflow_name``, as ``TaskSubmitted`` does; a v1 command (or
    # one without ``v``, as a publisher writes JSON by hand) names it ``workflow`` and is
    # read through an upcaster (kernelflow.events.codec).
    v: int = 2
    # A predefined workflow's name; or, with ``workflow_yaml``, the name of that document.
    workflow_name: str = "default"
    workflow_yaml: str | None = None
    # A registered kernel backend's name (kernelflow.verification.backends), checked when the
    # task is submitted.
    backend: Annotated[str, msgspec.Meta(pattern=BACKEND_NAME_PATTERN)] = "triton"
    # The verifier's strictness policy for this task's candidates (``strict`` or
    # ``kernelbench``; kernelflow.verification.policy), checked when it is submitted.
    policy: PolicyName = "strict"
    group_id: str | None = None
    # Existing code to start from (the verifier_only workflow verifies it as is).
    candidate_code: str | None = None
    # Wall-clock seconds the task may take from submission; checked at every decision.
    deadline_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    metadata: dict[str, str] = {}
    # A task that is a prompt rather than a kernel (``kernelflow rollout``): the question
    # for the workflow's start agent, and the reference answer reward functions compare
    # with. With ``prompt`` set, ``task_source`` may be empty.
    prompt: str | None = None
    reference_answer: str | None = None
    # Files the task's agents start from in their workspace (coding agents), path -> text.
    files: dict[str, str] = {}
    # Reward functions to record when the task finishes (``name@version``); empty: the
    # defaults for the kind of task.
    rewards: list[str] = []
    # Kernels of earlier tasks the coder builds on (a search's parents and inspirations).
    prior_kernels: list[PriorKernel] = []
    # Trials and time limit of the task's verifications (None: the verifier's own).
    verify_limits: VerifyLimits | None = None


class CancelTask(Command, tag="cancel_task", frozen=True, kw_only=True):
    task_id: TaskId
    reason: str = "cancelled by user"


AnyCommand = SubmitTask | CancelTask


# --------------------------------------------------------------------------- value types


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    # Prompt caching (Anthropic): tokens written to / read from the cache, not included in
    # ``input_tokens``.
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


class ToolUse(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call a model asked for: natively (its API's tool use) or in its text."""

    id: str  # the provider's call id, or ``<llm call event id>#<n>`` for text calls
    name: str
    args: dict[str, Any] = {}


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A message in the provider-neutral chat format (OpenAI's shape): ``role`` is
    system, user, assistant or tool. An assistant message may carry the tool calls it made;
    a ``tool`` message is the result of the call ``tool_call_id``."""

    role: str
    content: str
    tool_calls: list[ToolUse] | None = None
    tool_call_id: str | None = None


class Roofline(msgspec.Struct, frozen=True, kw_only=True):
    """How far a timed candidate is from the machine's limit (docs/verifier.md,
    "Speed-of-light"): the reference's work and least traffic at the task's shapes, the
    peaks measured where it was timed, the time they allow, and the candidate's share."""

    flops: float  # floating-point operations of one call (torch's FLOP counter)
    bytes: float  # inputs, parameters and outputs, each once
    peak_gbs: float  # a large copy's bandwidth
    peak_gflops: float  # a square matmul's throughput in the inputs' dtype
    attainable_ms: float  # max(flops / peak compute, bytes / peak bandwidth)
    bound: Literal["memory", "compute"]
    sol_fraction: float  # attainable_ms / the candidate's median


class TimingStats(msgspec.Struct, frozen=True, kw_only=True):
    """Timing of candidate and baseline (milliseconds per call) on the device that checked
    them (a GPU; the CPU for C++ kernels), measured interleaved."""

    candidate_ms: dict[str, float] = {}  # quantiles: "p20", "median", "p80", "min", "mean"
    baseline_ms: dict[str, float] = {}
    baseline: str = "eager"  # what the speedup is measured against: "eager" | "compile"
    reps: int = 0
    flags: list[str] = []  # plausibility flags, e.g. "speedup above 10x: re-timed"
    # 95 % confidence interval of each median ([low, high], ms; distribution-free, from
    # the order statistics of the rounds); empty in reports that predate it.
    candidate_ci_ms: list[float] = []
    baseline_ci_ms: list[float] = []
    rounds: int = 0  # timed rounds per side (each a batch of ``reps`` calls)
    warmup: int = 0  # calls per side before the first round
    # The speedup over each baseline timed ("eager"; "compile" too when asked for).
    speedups: dict[str, float] = {}
    # The speedup's range that both medians' intervals allow ([low, high]); empty in
    # reports that predate it.
    speedup_ci95: list[float] = []
    threads: int = 0  # the CPU threads candidate and baseline computed with (0: not set)
    input_copies: int = 0  # the copies of the inputs calls took in turn (cold caches)
    method: str = ""  # how the times were taken, in words
    # The speedup's range over each baseline timed ("eager"; "compile" too when asked
    # for); empty in reports that predate it.
    speedup_intervals: dict[str, list[float]] = {}
    # The candidate against the machine's limit; None: not counted (an op torch's FLOP
    # counter cannot follow), or recorded before it was.
    roofline: Roofline | None = None
    # Seconds the timing waited for one of the node's timing slots (verifiers of a node
    # time one at a time, KF_TIMING_SLOTS).
    queued_s: float = 0.0


class VerificationReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the verifier found out about one candidate kernel."""

    verdict: Verdict
    summary: str
    errors: list[str] = []
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatches: list[str] = []
    trials: int = 0
    speedup: float | None = None
    device: str = ""
    backend: str = ""
    duration_s: float = 0.0
    # Machine-readable reasons: "rule: explanation" lines (e.g. "torch_compute: ...").
    reasons: list[str] = []
    # Concise, bounded text written for the coder (key error lines, mismatch summary, rule).
    feedback: str = ""
    timing: TimingStats | None = None
    shapes: list[dict[str, int]] = []  # the size overrides each checked shape set used
    # Which verifier judged: its version (``VERIFIER_VERSION``; 0: recorded before
    # versions were) and the anti-cheat checks it had on.
    verifier_version: int = 0
    checks: list[str] = []
    # The device's name, its driver, and the versions of python, torch, triton, CUDA.
    environment: dict[str, str] = {}
    # The strictness policy it was judged under ("": recorded before policies, which is
    # ``strict``), and what that policy let pass but records ("rule: explanation" lines,
    # e.g. PyTorch compute kept in PyTorch under ``kernelbench``).
    policy: str = ""
    warnings: list[str] = []
    # The (atol, rtol) each output dtype was compared with.
    tolerances: dict[str, list[float]] = {}
    # Whether ``speedup`` says anything: its 95 % interval (``timing.speedup_ci95``)
    # excludes 1 and spans at most a factor of 2. False: inconclusive (the machine was
    # busy, or no difference could be told), not counted in fast_p nor geomeans, and
    # speedup rewards credit parity. None: not timed, or recorded before the flag was
    # (``kernelflow.projections.speedups.report_conclusive`` then applies the rule to
    # the recorded interval).
    speedup_conclusive: bool | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def roofline(self) -> Roofline | None:
        """The candidate against the machine's limit, where it was counted."""
        return self.timing.roofline if self.timing is not None else None

    @property
    def sol_fraction(self) -> float | None:
        """The candidate's fraction of speed-of-light (``Roofline.sol_fraction``)."""
        return self.roofline.sol_fraction if self.roofline is not None else None

    @property
    def fault(self) -> str | None:
        """Whose fault a verdict that is not the candidate's is: "task" or "node" (None
        for every verdict on the candidate)."""
        if self.verdict == "task_error":
            return "task"
        return "node" if self.verdict == "unsupported" else None


# --------------------------------------------------------------------------- events


# gc=False: events are trees of plain data and can never be part of a reference cycle.
# Replays and conductors hold a task's events until it ends; tracked, every one of them
# would be promoted to the oldest generation and walked by each full collection.
class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    """Something that happened to a task. Events are facts: they are never refused."""

    v: int = SCHEMA_VERSION
    task_id: TaskId
    seq: int = 0
    at: float = 0.0
    cause: str = ""

    @property
    def event_id(self) -> str:
        return f"{self.task_id}:{self.seq}"

    @property
    def kind(self) -> str:
        return type(self).__struct_config__.tag  # type: ignore[return-value]


class ForkOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """Where a forked task's history came from (``kernelflow fork``, docs/workflows.md,
    "Forking a task"): its events 2 to ``at`` are those of task ``task_id`` with the same
    ``seq``, copied as recorded (only their task id, and the ids that name it, rewritten);
    what the fork changed is in ``changed`` (``workflow``, ``policy``, ``backend``, ``llm``:
    the new value)."""

    task_id: str
    at: int
    changed: dict[str, str] = {}


# The version of the routing rules a new task is decided by (docs/workflows.md,
# "Routing"); a task keeps the version it was submitted under, so that its recorded
# decisions replay as they were made. 2: a sequence counts a retried run once, a prompt
# workflow keeps its final answer's steps, and a prompt task ends well only after an agent
# that may end it (issue 54).
ROUTING_VERSION = 2


class TaskSubmitted(Event, tag="task_submitted", frozen=True, kw_only=True):
    # v2 records ``routing_version``; a v1 task (before it) reads as routing version 1.
    v: int = 2
    task_name: str
    task_source: str
    workflow_name: str
    # The resolved workflow document, so replay never depends on files that may change.
    workflow_yaml: str
    backend: str
    group_id: str
    candidate_code: str | None = None
    policy: PolicyName = "strict"  # the verifier's strictness policy (SubmitTask.policy)
    deadline_s: float | None = None
    metadata: dict[str, str] = {}
    prompt: str | None = None
    reference_answer: str | None = None
    files: dict[str, str] = {}
    rewards: list[str] = []
    prior_kernels: list[PriorKernel] = []
    verify_limits: VerifyLimits | None = None  # SubmitTask.verify_limits
    routing_version: int = ROUTING_VERSION
    # Set on the first event of a fork: the task and event it was forked from.
    forked_from: ForkOrigin | None = None
    # What the task started with (kernelflow.actors.pins): workflow_sha256, verifier,
    # policy, torch, triton, compiler, llm (or llm.<agent>); empty before they were pinned.
    versions: dict[str, str] = {}


class TaskRejected(Event, tag="task_rejected", frozen=True, kw_only=True):
    reason: str
    task_name: str = ""


class TaskCancelled(Event, tag="task_cancelled", frozen=True, kw_only=True):
    reason: str


class TaskFinished(Event, tag="task_finished", frozen=True, kw_only=True):
    status: TaskStatus
    reason: str
    final_code: str | None = None
    verdict: Verdict | None = None
    speedup: float | None = None
    # A prompt task's answer (the last parsed output), which reward functions compare with
    # the reference answer.
    final_answer: str | None = None
    # The last verification's ``speedup_conclusive`` (None: not timed, or recorded before
    # the flag was: then it is that verification's).
    speedup_conclusive: bool | None = None
    # The event id of the verification whose kernel the task ends with, where it is not the
    # last one (a workflow that improves after a pass keeps its best passing kernel:
    # docs/workflows.md, "Improving after a pass"); None: the last verification.
    final_check: str | None = None


class AgentDispatched(Event, tag="agent_dispatched", frozen=True, kw_only=True):
    """Work for an agent. Agents consume these from the log; the id is ``dispatch_id``."""

    agent: str
    step: int
    dispatch_id: str
    suggestion: str = ""


class LLMCalled(Event, tag="llm_called", frozen=True, kw_only=True):
    agent: str
    dispatch_id: str
    provider: str
    model: str
    messages: list[ChatMessage]
    params: dict[str, Any] = {}
    response_text: str
    stop_reason: str = ""
    usage: Usage = Usage()
    latency_s: float = 0.0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # Price of the call in USD from the configured price table (None: model not priced).
    cost_usd: float | None = None
    # Attempts that failed (429, overloaded, 5xx, timeout...) before the answer.
    retries: int = 0
    # The provider's id of the answering request (``request-id`` / ``x-request-id``).
    request_id: str = ""
    # The prompt as token ids, when the server returns them (vLLM ``return_token_ids``).
    prompt_token_ids: list[int] | None = None
    # Tools offered to the model (OpenAI function format: name, description, parameters)
    # and the calls it made, natively or parsed from its text by the agent's kind.
    tools: list[dict[str, Any]] = []
    tool_calls: list[ToolUse] = []


class ToolCalled(Event, tag="tool_called", frozen=True, kw_only=True):
    """One tool call made for an agent, and what came of it. A failure (bad arguments,
    timeout, rate limit, the tool's own error) is an observation for the agent, not an
    error of the task. The call is recorded after it ran: a daemon killed in between runs
    it again (tools are at-least-once; the workspace tools are idempotent)."""

    agent: str
    dispatch_id: str
    call_id: str  # ToolUse.id of the call this answers
    tool: str
    args: dict[str, Any] = {}
    ok: bool
    output: str  # what the agent is shown (bounded by the tool's output limit)
    error: str = ""
    truncated: bool = False
    duration_s: float = 0.0


class OutputParsed(Event, tag="output_parsed", frozen=True, kw_only=True):
    agent: str
    dispatch_id: str
    fields: dict[str, Any]


class ParseFailed(Event, tag="parse_failed", frozen=True, kw_only=True):
    agent: str
    dispatch_id: str
    reason: str


class AgentFailed(Event, tag="agent_failed", frozen=True, kw_only=True):
    """The agent could not do its work (provider down, scripted responses exhausted...)."""

    agent: str
    dispatch_id: str
    error: str


class VerificationCompleted(Event, tag="verification_completed", frozen=True, kw_only=True):
    agent: str
    dispatch_id: str
    code: str
    report: VerificationReport


class RemovedOption(msgspec.Struct, frozen=True, kw_only=True):
    """An agent a workflow limit took out of a decision, and the counts that did it."""

    agent: str
    # "max_step", "max_step_reserve" (the steps a prompt task's final answer needs),
    # "single_agent" or "sequence"
    limit: str
    count: int  # agents run so far / runs of the agent in a row / back-to-back repeats
    maximum: int  # the limit that count reached
    sequence: str = ""  # the sequence's name, for a "sequence" limit


class ConductorDecided(Event, tag="conductor_decided", frozen=True, kw_only=True):
    after_agent: str
    options: list[str]
    mode: DecisionMode
    chosen: str
    reason: str
    suggestion: str = ""
    # The agents the limits removed from ``options`` (or, after a parse failure, the
    # retry they removed); decisions recorded before this field have none.
    removed: list[RemovedOption] = []


class RewardAssigned(Event, tag="reward_assigned", frozen=True, kw_only=True):
    """The outcome reward of the task by one named, versioned reward function
    (``kernelflow.projections.rewards``), recorded with its inputs so a re-export gives the same
    numbers even if the function later changes (it then gets a new version)."""

    reward_fn: str
    version: int
    value: float
    inputs: dict[str, Any] = {}


class KernelReverified(Event, tag="kernel_reverified", frozen=True, kw_only=True):
    """The kernel a task ended with, checked again by a newer verifier
    (``kernelflow reverify``), after the task's end. What happened stays recorded as it
    was; verdicts, rewards, datasets and reports take the newest check of a task's kernel
    unless asked for an older verifier version. ``kernel_of`` is the id of the event whose
    code was checked (the task's ``TaskFinished``)."""

    kernel_of: str
    report: VerificationReport
    previous_verdict: str | None = None
    previous_version: int = 0


class UnknownEvent(Event, tag="__unknown__", frozen=True, kw_only=True):
    """An event of a kind this version of kernelflow does not know, written by a newer one.

    It keeps its place in the task's history (its ``seq`` counts, so appends stay in
    order) and its bytes (``raw``: an export writes it back as it was recorded), but no
    projection interprets it. Never part of ``AnyEvent``: nothing encodes one as such."""

    original_kind: str
    raw: bytes

    @property
    def kind(self) -> str:
        return self.original_kind


class QuarantinedEvent(Event, tag="__quarantined__", frozen=True, kw_only=True):
    """A message on a task's subjects that is not one of its events: undecodable, recorded
    on another task's or kind's subject than its JSON says, or out of its task's sequence
    (see ``kernelflow.events.quarantine``). Anyone allowed to publish on ``kf.ev.>`` can
    put such a message into the append-only log; reads skip it instead of failing.

    It has no place in its task's sequence (``seq`` 0: appends number events as if it
    were not there), but it holds the task's last stream sequence like any message on its
    subjects, so an append after it names its stream position. ``task_id`` is the task
    its subject names (``kf.ev.<task>.…``); ``evidence`` the first bytes of the message.
    Never part of ``AnyEvent``: projections skip it, and only an export file writes it
    (``kernelflow.projections.logfile``)."""

    task_id: str  # a subject token: not necessarily a valid task id
    subject: str
    stream_seq: int
    reason: str
    size: int  # of the message, in bytes
    evidence: bytes = b""


AnyEvent = (
    TaskSubmitted
    | TaskRejected
    | TaskCancelled
    | TaskFinished
    | AgentDispatched
    | LLMCalled
    | ToolCalled
    | OutputParsed
    | ParseFailed
    | AgentFailed
    | VerificationCompleted
    | ConductorDecided
    | RewardAssigned
    | KernelReverified
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
COMMAND_TYPES: tuple[type[Command], ...] = AnyCommand.__args__

# Events after which the conductor must decide what happens next. (A task's first
# decisions are recorded with its TaskSubmitted, by the conductor that took the submit
# command, which is acked only then: a redelivered command takes them up again.)
DECISION_TRIGGERS: tuple[type[Event], ...] = (
    OutputParsed,
    ParseFailed,
    AgentFailed,
    VerificationCompleted,
)
# Events that end a task; nothing is appended after one of them.
TERMINAL_EVENTS: tuple[type[Event], ...] = (TaskRejected, TaskCancelled, TaskFinished)
_TERMINAL_TYPES = frozenset(TERMINAL_EVENTS)


def ends_task(event: Event) -> bool:
    """Whether ``event`` ends its task (is one of ``TERMINAL_EVENTS``).

    Replays ask this of every event. ``isinstance`` against struct classes goes through
    their metaclass's generic ``__instancecheck__``, ~0.2 µs per class tried; event classes
    are never subclassed, so a set lookup of the exact type answers the same in a fifth.
    """
    return type(event) in _TERMINAL_TYPES


# Events that close an agent's dispatch.
DISPATCH_RESULTS: tuple[type[Event], ...] = (
    OutputParsed,
    ParseFailed,
    AgentFailed,
    VerificationCompleted,
)
