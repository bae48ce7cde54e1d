"""A task's OpenTelemetry trace, as a collector receives it: two real daemons (one hosting
the conductor, the designer and a ReAct coder with kernel tools, one the verifier) send
their spans over OTLP/HTTP, configured by OTel's standard variables, to a receiver of the
test's own that decodes each request with OTLP's protobuf messages."""

from __future__ import annotations

import gzip
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from kernelflow.host.exits import UsageError
from kernelflow.host.observability import trace_exporters
from kernelflow.telemetry.traces import span_id_of, trace_id_of
from tests.conftest import keyed_nats
from tests.daemons import start_daemon, submit, wait_for_line, wait_until_settled

TASK = "traced-relu-1"
TASK_SOURCE_LINE = "return torch.relu(x)"


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root span
    attributes: dict[str, Any]
    resource: dict[str, Any]


class OtlpReceiver:
    """An OTLP/HTTP trace collector on loopback: it keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.paths: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.add(self.path, ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, path: str, request: ExportTraceServiceRequest) -> None:
        spans = [
            Span(
                span.name,
                int.from_bytes(span.trace_id, "big"),
                int.from_bytes(span.span_id, "big"),
                int.from_bytes(span.parent_span_id, "big"),
                _attributes(span.attributes),
                _attributes(batch.resource.attributes),
            )
            for batch in request.resource_spans
            for scope in batch.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.paths.add(path)
            self.spans.extend(spans)

    def wait_for(self, names: dict[str, int], timeout_s: float = 30) -> list[Span]:
        """Every span received once at least ``names`` (name -> count) have come."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            counts = {n: sum(s.name == n for s in spans) for n in names}
            if all(counts[n] >= k for n, k in names.items()):
                return spans
            assert time.monotonic() < deadline, (counts, sorted(s.name for s in spans))
            time.sleep(0.2)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@pytest.fixture(scope="module")
def spans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Span]]:
    """The spans of one task run by two daemons, each exporting its own."""
    tmp = tmp_path_factory.mktemp("traces")
    receiver = OtlpReceiver()
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with keyed_nats(tmp / "nats") as url:
        script = "examples/scripted/relu_react.yaml"
        daemons = [
            start_daemon(url, tmp / "agents.log", "--roles", "conductor,designer,coder",
                         script=script, **otel),
            start_daemon(url, tmp / "verifier.log", "--roles", "verifier",
                         "--no-read-model", script=script, **otel),
        ]  # fmt: skip
        try:
            for log in ("agents.log", "verifier.log"):
                wait_for_line(tmp / log, "kernelflow daemon on")
            submit(url, TASK, "--workflow", "examples/workflows/react_coder.yaml")
            wait_until_settled(url, TASK)
            yield receiver.wait_for(
                {"task": 1, "step verifier": 1, "sandbox run": 1, "tool check_kernel": 2}
            )
        finally:
            for daemon in daemons:
                daemon.send_signal(signal.SIGTERM)
            for daemon in daemons:
                daemon.wait(timeout=60)
            receiver.close()
    assert receiver.paths == {"/v1/traces"}


def test_one_trace_per_task_across_daemons(spans: list[Span]) -> None:
    assert {s.trace_id for s in spans} == {trace_id_of(TASK)}
    assert all(s.attributes["kernelflow.task_id"] == TASK for s in spans)
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "a span was recorded twice"
    (task,) = [s for s in spans if s.name == "task"]
    assert task.parent_id == 0 and task.span_id == span_id_of("task", TASK)
    assert task.attributes["kernelflow.status"] == "success"
    # Every other span hangs from the task: no parent is missing, whoever recorded it.
    for span in spans:
        ancestor = span
        while ancestor.parent_id:
            ancestor = by_id[ancestor.parent_id]
        assert ancestor is task, span
    # Each daemon exported what it did: the verifier's step and sandbox run came from the
    # verifier's daemon, the rest from the other one.
    verifier_side = {s.name for s in spans if s.resource != task.resource}
    assert verifier_side == {"step verifier", "sandbox run"}
    assert {s.resource["service.name"] for s in spans} == {"kernelflow"}
    # The daemon's id, as `kernelflow health` names it (host-pid-random).
    assert task.resource["service.instance.id"].startswith(socket.gethostname() + "-")


def test_task_step_and_call_spans(spans: list[Span]) -> None:
    by_id = {s.span_id: s for s in spans}
    steps = [s for s in spans if s.name.startswith("step ")]
    assert sorted(s.attributes["kernelflow.agent"] for s in steps) == [
        "coder",
        "designer",
        "verifier",
    ]
    assert all(by_id[s.parent_id].name == "task" for s in steps)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert {by_id[s.parent_id].name for s in chats} == {"step designer", "step coder"}
    assert all(s.attributes["gen_ai.usage.input_tokens"] > 0 for s in chats)
    tools = [s for s in spans if s.name == "tool check_kernel"]
    assert {by_id[s.parent_id].name for s in tools} == {"step coder"}
    (sandbox,) = [s for s in spans if s.name == "sandbox run"]
    assert by_id[sandbox.parent_id].name == "step verifier"
    assert sandbox.attributes["kernelflow.verdict"] == "pass"
    assert {by_id[s.parent_id].name for s in spans if s.name == "decide"} == {"task"}


def test_no_prompt_or_code_in_span_attributes(spans: list[Span]) -> None:
    values = [str(v) for s in spans for v in (*s.attributes.values(), *s.resource.values())]
    assert not [v for v in values if "ModelNew" in v or TASK_SOURCE_LINE in v or "\n" in v]


def test_traces_are_off_unless_otel_names_an_exporter() -> None:
    assert trace_exporters({}) == ()
    assert trace_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ("otlp",)
    assert trace_exporters({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ("console", "otlp")
    assert trace_exporters({"OTEL_TRACES_EXPORTER": "none"}) == ()
    disabled = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}
    assert trace_exporters(disabled) == ()
    with pytest.raises(UsageError, match="zipkin"):
        trace_exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(UsageError, match="http/protobuf"):
        trace_exporters({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
