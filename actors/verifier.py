"""The verifier actor: the only actor that runs candidate code, and only in a sandbox."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.devices import device_label
from kernelflow.actors.extension_store import with_shared_extensions
from kernelflow.actors.worker import (
    DispatchWorker,
    Message,
    Settlement,
    current_dispatch,
    state_of,
)
from kernelflow.events.codec import decode_event
from kernelflow.events.log import AppendConflict
from kernelflow.events.model import (
    AgentDispatched,
    OutputParsed,
    VerificationCompleted,
    VerificationReport,
    VerifyLimits,
)
from kernelflow.projections.task_state import Dispatch, TaskState, workflow_of
from kernelflow.verification.engine import (
    VerifierConfig,
    checking_device,
    offered_backends,
    verify,
    warm_up,
)
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.workflows.model import VERIFIER


def candidate_code(state: TaskState, d: Dispatch) -> str | None:
    """What this verification checks: the code the previous agent produced (its code
    field: docs/workflows.md, "The verifier"), or, when the verifier runs first, the code
    submitted with the task."""
    index = state.dispatches.index(d)
    if index == 0:
        return state.submitted.candidate_code if state.submitted else None
    previous = state.dispatches[index - 1]
    spec = workflow_of(state).agents.get(previous.agent)
    if isinstance(previous.result, OutputParsed) and spec is not None:
        return spec.code_in(previous.result.fields)
    return None


class WarmUps:
    """How far each verifier of a daemon got readying its sandbox, by the device it owns
    (``device_label``: "any" without ``--devices``): what ``kernelflow health`` shows.
    Safe from any thread."""

    WARMING, READY, FAILED = "warming up", "ready", "failed"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, dict[str, Any]] = {}

    def record(
        self, config: VerifierConfig, state: str, detail: str = "", backends: Sequence[str] = ()
    ) -> None:
        """``backends``: those its checks can run (``kernelflow submit`` asks for them)."""
        with self._lock:
            entry: dict[str, Any] = {"state": state, "detail": detail}
            if state == self.READY:
                entry["backends"] = list(backends)
            self._states[device_label(config)] = entry

    def describe(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {device: dict(entry) for device, entry in self._states.items()}


class Verifier(DispatchWorker):
    role = VERIFIER

    def __init__(
        self, bridge: Bridge, config: VerifierConfig, warm_ups: WarmUps | None = None
    ) -> None:
        super().__init__(bridge)
        # Its checks share compiled extensions with the cluster's other verifiers.
        self.config = with_shared_extensions(bridge, config)
        self.warm_ups = warm_ups or WarmUps()
        self.warm_ups.record(config, WarmUps.WARMING)  # from now until on_start is done

    def handle(self, message: Message) -> Settlement:
        dispatched = decode_event(message.data)
        assert isinstance(dispatched, AgentDispatched)
        history = self.history_at(message)
        report: VerificationReport | None = None
        while True:
            state = state_of(history)
            d = current_dispatch(state, dispatched)
            if d is None:
                return "ack"
            assert state.submitted is not None
            code = candidate_code(state, d)
            if report is None:  # a conflict does not make the check worth running again
                submitted = state.submitted
                report = self.check(
                    submitted.task_source,
                    code,
                    submitted.backend,
                    submitted.policy,
                    submitted.verify_limits,
                )
            event = VerificationCompleted(
                task_id=state.task_id,
                cause=d.event.event_id,
                agent=VERIFIER,
                dispatch_id=d.dispatch_id,
                code=code or "",
                report=report,
            )
            try:
                self.append(history, event)
                return "ack"
            except AppendConflict:
                history = self.read(dispatched.task_id)

    def on_start(self) -> None:
        # On the actor's own thread: the warm process dies with the thread that started it,
        # so that must be one that lives as long as the verifier. A candidate that arrives
        # meanwhile waits in the inbox for what it would have waited for anyway.
        self.warm_up()

    def warm_up(self) -> None:
        """Ready the sandbox before the first candidate arrives (see ``engine.warm_up``)."""
        started = time.monotonic()
        try:
            readied = warm_up(self.config)
        except Exception as exc:  # the first verification meets the same problem and reports it
            self.warm_ups.record(self.config, WarmUps.FAILED, str(exc))
            self.log.warning("verifier warm-up failed: %s", exc)
            return
        backends = offered_backends(checking_device(self.config))
        self.warm_ups.record(self.config, WarmUps.READY, readied, backends)
        self.log.info("verifier warm-up done in %.1fs: %s", time.monotonic() - started, readied)

    def check(
        self,
        task_source: str,
        code: str | None,
        backend: str,
        policy: str = DEFAULT_POLICY,
        limits: VerifyLimits | None = None,
    ) -> VerificationReport:
        """``limits``: the task's trials and time limit, where it asks for its own."""
        if code is None:
            return VerificationReport(
                verdict="compile_error",
                summary="no candidate code to verify: the previous agent produced none",
                errors=["Produce a complete module defining class ModelNew."],
                reasons=["no_code: the previous agent produced no code"],
                feedback="Produce a complete module defining class ModelNew.",
                backend=backend,
                policy=policy,
            )
        self.log.info("verifying a %s candidate (%d bytes, policy %s)", backend, len(code), policy)
        config = self.config
        if limits is not None:
            config = replace(
                config,
                trials=limits.trials or config.trials,
                timeout_s=limits.timeout_s or config.timeout_s,
                timing=config.timing if limits.timing is None else limits.timing,
            )
        return verify(task_source, code, backend=backend, policy=policy, config=config)
