"""Health checks: is everything a run needs up? (``kernelflow health`` is their command
line: arguments, printing, exit status.)

Checks, in order: NATS (reachable, JetStream enabled); who the server lets in (holders
of credentials it knows, or anyone), over TLS or not; the streams (``KF_EVENTS``,
``KF_CMD``: present, with the subjects, retention and storage kernelflow needs); the
durable consumers (work waiting for a role no daemon hosts); the daemons (each answers
``kf.health.ping`` with its roles, pools, uptime, LLM and how ready its verifiers are, a
failed sandbox warm-up failing the check; at least ``DaemonsWanted.at_least`` must answer
within ``wait_s`` seconds, none when ``none_needed``; a command's own daemon, which takes
only its command's tasks, is listed as a ``command`` and counts for nothing); the LLM
provider this machine is configured with (the spec resolves into providers, per agent;
nothing is called, so nothing is paid); the tool registry (every tool builds); and how
this machine's sandbox isolates candidates (``warn`` where it cannot, saying whether they
are refused or run anyway under ``KF_SANDBOX_ALLOW_NETWORK=1``).

Each check adds a row to a ``Report``: ``ok``, ``warn`` (worth knowing, not blocking),
``fail`` or ``skip``; the report is healthy without a ``fail``. The checks only read:
they create no stream.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from dataclasses import asdict, dataclass
from typing import Any

from kernelflow.actors.connection import (
    ClientAuth,
    CredentialsError,
    NatsAccessRefused,
    NatsEndpoint,
    check_tls,
    refusal,
    safe_url,
    server_urls,
)
from kernelflow.actors.daemon import DEFAULT_ROLES
from kernelflow.actors.health_pings import llm_description, ping_daemons, safe_spec
from kernelflow.events import subjects
from kernelflow.events.consumers import ConsumersPort
from kernelflow.events.inspection import Inspection, StreamNotFound
from kernelflow.events.nats_inspection import inspect_nats
from kernelflow.events.requests import RequestsPort
from kernelflow.host.nats_server import NatsServerError
from kernelflow.host.settings import Settings
from kernelflow.llm import (
    EndpointUnreachable,
    ProviderRouter,
    ProviderSpecError,
    default_llm_spec,
    make_provider,
)
from kernelflow.projections.report import wrapped_table
from kernelflow.sandbox import isolation_status
from kernelflow.tools import make_tool, tool_names
from kernelflow.verification.backends import backend, backend_names
from kernelflow.verification.backends import plugin_errors as backend_plugin_errors
from kernelflow.verification.engine import detect_device
from kernelflow.workflows.model import VERIFIER

# ``absent``: not here, and nothing wrong for the question asked (no GPU on a CPU machine,
# no daemon when none was asked for, streams no daemon has made yet).
OK, WARN, FAIL, SKIP, ABSENT = "ok", "warn", "fail", "skip", "absent"
# The default roles that call an LLM: whose settings are shown when no workflow narrows
# them down.
LLM_AGENTS = tuple(role for role in DEFAULT_ROLES if role != VERIFIER)


@dataclass
class Check:
    """One row of a report: what was checked and how it stands."""

    component: str
    name: str
    status: str
    detail: str


@dataclass(frozen=True)
class DaemonsWanted:
    """How long to gather the daemons' answers (``--wait``), and how many must answer
    (``--min-daemons``: none unless asked; ``--no-daemons``: none is even looked for)."""

    wait_s: float = 1.0
    at_least: int = 0
    none_needed: bool = False


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    retention: str  # ``StreamDescription.retention``'s words


STREAMS = (
    StreamSpec(subjects.EVENTS_STREAM, [subjects.ALL_EVENTS], "limits"),
    StreamSpec(subjects.COMMANDS_STREAM, [subjects.ALL_COMMANDS], "workqueue"),
)


class Report:
    """What the checks found: a row per check (``add``) and the details they gathered
    (``sections``, in ``as_json``)."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.sections: dict[str, Any] = {}

    def add(self, component: str, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(component, name, status, detail))

    @property
    def healthy(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checks": [asdict(c) for c in self.checks],
            **self.sections,
        }

    def text(self, width: int = 100) -> str:
        """A table ``width`` characters wide at most (each detail wrapped under its
        column; ``as_json`` has them whole), under the line saying what was checked."""
        rows = [[c.component, c.name, c.status.upper(), c.detail] for c in self.checks]
        fails = sum(c.status == FAIL for c in self.checks)
        warns = sum(c.status == WARN for c in self.checks)
        verdict = "healthy" if self.healthy else f"UNHEALTHY: {fails} check(s) failed"
        if warns:
            verdict += f" ({warns} warning{'s' if warns > 1 else ''})"
        checked = self.sections.get("checked")
        head = textwrap.fill(f"checked: {checked}", width) + "\n\n" if checked else ""
        return (
            head
            + wrapped_table(["component", "name", "status", "detail"], rows, width)
            + (f"\n\n{verdict}")
        )


# --------------------------------------------------------------------------- NATS side


async def check_nats(
    endpoint: NatsEndpoint, report: Report, daemons: DaemonsWanted, replicas: int
) -> None:
    url, auth = endpoint
    shown = safe_url(url)
    report.sections["nats_url"] = shown
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    def not_connected(why: str) -> None:
        report.add("nats", shown, FAIL, why)
        report.add("streams", "-", SKIP, "NATS unreachable")
        report.add("daemons", "-", FAIL if daemons.at_least else SKIP, "NATS unreachable")

    try:
        # One try per server, no reconnecting: a health check must not hang.
        server = await asyncio.wait_for(
            inspect_nats(server_urls(url), auth.options(), on_error), timeout=15
        )
    except CredentialsError as exc:
        not_connected(str(exc))
        return
    except Exception as exc:
        failure = errors[-1] if errors else exc
        why = refusal(failure, url, auth)
        not_connected(why or f"cannot connect: {str(failure) or repr(failure)}")
        return
    try:
        info = server.server_info
        try:
            check_tls(info, url, auth)
        except NatsAccessRefused as exc:
            not_connected(str(exc))
            return
        version = info.get("version", "?")
        try:
            account = await server.account()
        except Exception as exc:
            report.add("nats", shown, FAIL, f"server {version}: JetStream not available: {exc!r}")
            report.sections["nats"] = {"version": version, "jetstream": False}
            check_access(report, info, auth)
            return
        report.sections["nats"] = {
            "version": version,
            "jetstream": True,
            "streams": account.streams,
            "storage_bytes": account.storage_bytes,
        }
        report.add(
            "nats",
            shown,
            OK,
            f"server {version}, JetStream enabled ({account.streams} streams, "
            f"{account.storage_bytes / 1e6:.1f} MB stored)",
        )
        check_access(report, info, auth)
        last_seq = await check_streams(server, report, replicas)
        if daemons.none_needed:
            report.add("daemons", "-", SKIP, "not looked for (--no-daemons)")
            hosted: set[str] = set()
        else:
            hosted = await check_daemons(server.requests, report, daemons, last_seq)
        await check_consumers(server.consumers, report, hosted)
    finally:
        await server.close()


def check_access(report: Report, info: dict[str, Any], auth: ClientAuth) -> None:
    """Whether the server lets in only holders of credentials it knows, and over TLS."""
    wire = "over TLS" if info.get("tls_required") else "in plaintext"
    report.sections["access"] = {
        "auth_required": bool(info.get("auth_required")),
        "tls": bool(info.get("tls_required")),
        "creds": str(auth.creds) if auth.creds else None,
    }
    if not info.get("auth_required"):
        report.add(
            "access",
            "authentication",
            WARN,
            f"none, {wire}: anyone who reaches the server can append to the log, purge or "
            "delete it (docs/security.md)",
        )
        return
    presented = f"credentials {auth.creds}" if auth.creds else "the URL's user"
    report.add("access", "authentication", OK, f"required, {wire}; presented {presented}")


async def check_streams(server: Inspection, report: Report, replicas: int) -> int:
    """Returns the event log's last sequence (0 when it is missing)."""
    streams: dict[str, Any] = {}
    last_seq = 0
    for spec in STREAMS:
        try:
            s = await server.stream(spec.name)
        except StreamNotFound:
            report.add(
                "stream",
                spec.name,
                ABSENT,
                "not made yet (the first daemon, or command with the daemon's key, makes it)",
            )
            streams[spec.name] = None
            continue
        streams[spec.name] = {
            "subjects": s.subjects,
            "retention": s.retention,
            "storage": s.storage,
            "replicas": s.replicas,
            "messages": s.messages,
            "bytes": s.bytes,
            "first_seq": s.first_seq,
            "last_seq": s.last_seq,
            "consumers": s.consumers,
        }
        if spec.name == subjects.EVENTS_STREAM:
            last_seq = s.last_seq
        problems = []
        if s.subjects != spec.subjects:
            problems.append(f"subjects {s.subjects}, need {spec.subjects}")
        if s.retention != spec.retention:
            problems.append(f"retention {s.retention}, need {spec.retention}")
        detail = (
            f"{s.messages} messages, {s.bytes / 1e6:.1f} MB, seq {s.first_seq}..{s.last_seq}, "
            f"{s.consumers} consumers, {s.storage} storage, replicas {s.replicas}"
        )
        if problems:
            report.add("stream", spec.name, FAIL, "; ".join(problems))
        elif s.storage != "file":
            report.add("stream", spec.name, WARN, f"{detail} (not file storage: not durable)")
        elif s.replicas != replicas:
            report.add("stream", spec.name, WARN, f"{detail} (KF_REPLICAS is {replicas})")
        else:
            report.add("stream", spec.name, OK, detail)
    report.sections["streams"] = streams
    return last_seq


async def check_daemons(
    requests: RequestsPort, report: Report, daemons: DaemonsWanted, last_seq: int
) -> set[str]:
    """Ping the daemons; return the roles they host. A command's own daemon (``run``,
    ``rollout``, ...: ``own_tasks_only``) is listed apart and counts for neither: it takes
    no work but its command's."""
    answered = await ping_daemons(requests, daemons.wait_s)
    answers = [a for a in answered if not a.get("own_tasks_only")]
    commands = [a for a in answered if a.get("own_tasks_only")]
    report.sections["daemons"] = answers
    report.sections["commands"] = commands
    for a in commands:
        listed = ", ".join(str(r) for r in a.get("roles", []))
        detail = f"{a.get('host')} pid {a.get('pid')}: {listed}, for its own tasks only"
        report.add("command", str(a.get("daemon_id", "?")), OK, detail)
    hosted: set[str] = set()
    for a in answers:
        roles = [str(r) for r in a.get("roles", [])]
        hosted.update(roles)
        pools = a.get("pools", {})
        llm = (a.get("llm") or {}).get("spec") or "none"
        detail = (
            f"{a.get('host')} pid {a.get('pid')}, up {float(a.get('uptime_s', 0)):.0f}s; "
            + ", ".join(f"{r} x{pools.get(r, '?')}" for r in roles)
            + f"; llm {llm}"
        )
        rm = a.get("read_model")
        if isinstance(rm, dict):
            lag = max(0, last_seq - int(rm.get("position", 0)))
            detail += f"; read model at {rm.get('position')} ({lag} behind)"
        status = WARN if "error" in a else OK
        quarantined = int(rm.get("quarantined", 0)) if isinstance(rm, dict) else 0
        if quarantined:
            # Skipped by every reader; `kernelflow log verify` lists them.
            status = WARN
            detail += f"; {quarantined} message(s) in the log quarantined (kernelflow log verify)"
        report.add("daemon", str(a.get("daemon_id", "?")), status, detail)
        check_verifiers(report, a)
    wanted = daemons.at_least
    if len(answers) < wanted:
        report.add(
            "daemons",
            f"{len(answers)} answering",
            FAIL,
            f"--min-daemons {wanted}: {len(answers)} answered within {daemons.wait_s:g}s "
            "(start one: kernelflow daemon)",
        )
    elif not answers:
        report.add(
            "daemons",
            "0 answering",
            ABSENT,
            f"none answered within {daemons.wait_s:g}s, and none was asked for "
            "(--min-daemons N asks for N; kernelflow daemon starts one)",
        )
    else:
        missing = [r for r in DEFAULT_ROLES if r not in hosted]
        if missing:
            report.add("daemons", "roles", WARN, f"no daemon hosts {', '.join(missing)}")
    return hosted


# A verifier still warming up is on its way (its first candidate waits for it); one whose
# warm-up failed will fail every candidate the same way.
_VERIFIER_STATUS = {"ready": OK, "warming up": WARN, "failed": FAIL}


def check_verifiers(report: Report, answer: dict[str, Any]) -> None:
    """One row per verifier of a daemon's answer: how far it got readying its sandbox."""
    for device, entry in sorted((answer.get("verifier") or {}).items()):
        state = str(entry.get("state", "?"))
        detail = state + (f": {entry['detail']}" if entry.get("detail") else "")
        name = f"{answer.get('daemon_id', '?')} device {device}"
        report.add("verifier", name, _VERIFIER_STATUS.get(state, WARN), detail)


async def check_consumers(consumers_port: ConsumersPort, report: Report, hosted: set[str]) -> None:
    """The daemons' durable consumers: work waiting for a role no answering daemon hosts."""
    consumers = []
    for spec in STREAMS:
        try:
            states = await consumers_port.states(spec.name)
        except Exception:
            continue
        for info in states:
            name = info.name
            role = subjects.role_of_consumer(name)
            if role is None:
                continue
            pending, in_flight = info.pending, info.ack_pending
            consumers.append(
                {
                    "stream": spec.name,
                    "name": name,
                    "role": role,
                    "pending": pending,
                    "ack_pending": in_flight,
                    "redelivered": info.redelivered,
                }
            )
            detail = f"{pending} waiting, {in_flight} in progress"
            if pending and role not in hosted:
                report.add("consumer", name, WARN, f"{detail}; no answering daemon hosts {role}")
            elif pending or in_flight:
                report.add("consumer", name, OK, detail)
    report.sections["consumers"] = consumers


# --------------------------------------------------------------------------- local side


def check_llm(report: Report, spec_arg: str | None, *, probe: bool = False) -> None:
    """The LLM provider configured here, resolved per agent (nothing called); with
    ``probe`` (``--llm SPEC``), each endpoint it names sent a one-token request."""
    try:
        spec = spec_arg or default_llm_spec()
    except ProviderSpecError as exc:
        report.add("llm", "config", FAIL, str(exc))
        report.sections["llm"] = {"error": str(exc)}
        return
    if not spec:
        used = sorted(
            {str((a.get("llm") or {}).get("spec")) for a in report.sections.get("daemons", [])}
            - {"None"}
        )
        if used:  # the daemons' own providers do the work: nothing is missing here
            detail = f"none set here; the daemons use {', '.join(used)}"
            report.add("llm", "-", OK, detail)
        else:
            report.add(
                "llm",
                "-",
                ABSENT,
                "none set here (--llm, KF_LLM, KF_LLM_CONFIG or ANTHROPIC_API_KEY); each "
                "daemon has its own",
            )
        report.sections["llm"] = {"provider": None, "agents": {}}
        return
    try:
        provider = make_provider(spec)
    except ProviderSpecError as exc:
        report.add("llm", safe_spec(spec) or "-", FAIL, str(exc))
        report.sections["llm"] = {"spec": safe_spec(spec), "error": str(exc)}
        return
    config = getattr(provider, "config", None)
    agents = sorted({*LLM_AGENTS, *getattr(config, "agents", {})})
    described = llm_description(provider, agents)
    report.sections["llm"] = described
    for agent, entry in described["agents"].items():
        if "error" in entry:
            report.add("llm", agent, FAIL, entry["error"])
            continue
        model = entry.get("model")
        status, note = OK, f", model {model}" if model else ""
        if entry.get("provider") == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
            status, note = WARN, f"{note}; ANTHROPIC_API_KEY is not set"
        report.add("llm", agent, status, f"{entry.get('spec')}{note}")
    if probe:
        probe_llm(report, provider, agents)


def probe_llm(report: Report, provider: ProviderRouter, agents: list[str]) -> None:
    """Send each endpoint the agents use a one-token request (``health --llm SPEC``): a row
    per endpoint, saying whether it answered, how fast, and with token ids and
    log-probabilities or not (docs/llm.md, "Serving a model of your own")."""
    try:
        answered = asyncio.run(provider.probe(agents, call=True))
    except EndpointUnreachable as exc:
        report.add("llm", "endpoint", FAIL, str(exc))
        report.sections["llm"]["probe"] = {"error": str(exc)}
        return
    report.sections["llm"]["probe"] = answered
    for spec, said in answered.items():
        report.add("llm", "endpoint", OK, f"{spec}: {said}")


def check_tools(report: Report) -> None:
    tools = []
    try:
        names = list(tool_names())
    except Exception as exc:
        report.add("tools", "registry", FAIL, f"tool_names() failed: {exc!r}")
        report.sections["tools"] = {"available": False, "error": repr(exc)}
        return
    for name in names:
        try:
            tool = make_tool(name)
        except Exception as exc:
            report.add("tool", name, FAIL, f"cannot be built: {exc!r}")
            tools.append({"name": name, "ok": False, "error": repr(exc)})
            continue
        limits = getattr(tool, "limits", None)
        entry: dict[str, Any] = {"name": name, "ok": True}
        detail = []
        if limits is not None:
            entry["limits"] = dict(vars(limits))
            detail.append(
                f"timeout {getattr(limits, 'timeout_s', '?')}s, "
                f"output ≤ {getattr(limits, 'max_output_chars', '?')} chars"
            )
        description = (getattr(tool, "description", "") or "").strip()
        first = description.splitlines()[0].split(". ")[0] if description else ""
        detail.append(textwrap.shorten(first, 90, placeholder=" …"))
        tools.append(entry)
        report.add("tool", name, OK, "; ".join(d for d in detail if d))
    if not names:
        report.add("tools", "registry", WARN, "the registry has no tools")
    report.sections["tools"] = {"available": True, "tools": tools}


def check_backends(report: Report) -> None:
    """The kernel backends tasks may name, and the plugins that failed to load."""
    names = backend_names()
    gpu = detect_device() == "cuda"
    for name in names:
        found = backend(name)
        if not found.needs_gpu:
            report.add("backend", name, OK, f"{found.title}; checked on the CPU too")
        elif gpu:
            report.add("backend", name, OK, f"{found.title}; on this machine's GPU")
        else:
            report.add(
                "backend",
                name,
                ABSENT,
                f"{found.title}; needs a GPU, and none is here (its tasks are answered "
                "unsupported on this machine)",
            )
    problems = backend_plugin_errors()
    for problem in problems:
        report.add("backends", "plugin", WARN, problem)
    report.sections["backends"] = {"names": names, "plugin_errors": problems, "gpu": gpu}


def check_sandbox(report: Report, settings: Settings) -> None:
    """How this machine's sandbox isolates candidates (the verifiers' and the tools'), and
    whether the operator opted in to running them without (``KF_SANDBOX_ALLOW_NETWORK``)."""
    status = isolation_status()
    opted_in = settings.sandbox_allow_network
    report.sections["sandbox"] = {
        "isolated": status.isolated,
        "probe": list(status.said),
        "allow_network": opted_in,
        "refusal": status.refusal,
    }
    said = "; ".join(status.said) or "the probe said nothing"
    if status.isolated:
        note = " (KF_SANDBOX_ALLOW_NETWORK=1 is set, not needed here)" if opted_in else ""
        report.add("sandbox", "isolation", OK, f"{said}{note}")
    elif opted_in:
        report.add(
            "sandbox",
            "isolation",
            WARN,
            "NOT isolated, candidates run anyway (KF_SANDBOX_ALLOW_NETWORK=1): they can "
            f"reach the network; {said}",
        )
    else:
        report.add(
            "sandbox", "isolation", WARN, f"candidates are refused (unsupported): {status.refusal}"
        )


# --------------------------------------------------------------------------- all of them


def run_checks(settings: Settings, daemons: DaemonsWanted, llm: str | None = None) -> Report:
    """Every check, in order; ``llm``: the provider spec to check instead of the
    configured one, its endpoints sent a one-token request."""
    report = Report()
    where = (
        f"NATS at {safe_url(settings.nats_url)}"
        if settings.nats_url
        else f"the embedded NATS server of {settings.data_dir}"
    )
    asked = (
        "not looked for"
        if daemons.none_needed
        else f"at least {daemons.at_least} required"
        if daemons.at_least
        else "none required"
    )
    report.sections["checked"] = (
        f"{where} (access, streams, work waiting), the daemons ({asked}), "
        + ("the LLM endpoint of --llm (a one-token request)" if llm else "the LLM set here")
        + ", tools, backends, this machine's sandbox"
    )
    try:
        with settings.nats() as endpoint:
            asyncio.run(check_nats(endpoint, report, daemons, settings.replicas))
    except NatsServerError as exc:
        report.add("nats", "embedded", FAIL, str(exc))
    check_llm(report, llm or settings.llm, probe=llm is not None)
    check_tools(report)
    check_backends(report)
    check_sandbox(report, settings)
    return report
