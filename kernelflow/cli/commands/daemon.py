"""``kernelflow daemon``: a long-running daemon hosting pools of actors for some roles,
with the status read model and the health responder, until SIGINT or SIGTERM, or until its
NATS has been unreachable for longer than ``--nats-give-up`` (exit status 1: a supervisor
restarts it)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

from kernelflow.actors.connection import safe_url
from kernelflow.actors.daemon import DEFAULT_ROLES
from kernelflow.actors.devices import split_cores, usable_cores
from kernelflow.actors.health_pings import HealthResponder, daemon_describer, new_daemon_id
from kernelflow.actors.readmodel import ReadModel
from kernelflow.cli.commands.options import (
    LLM_HELP,
    add_agent_llm_options,
    add_connection_options,
    add_devices_option,
)
from kernelflow.common.suggest import did_you_mean
from kernelflow.host.exits import EXIT_OK, UsageError
from kernelflow.host.observability import start_telemetry
from kernelflow.host.runtime import ABANDONED_STOP_WAIT_S, connected, start_daemon
from kernelflow.host.settings import Settings, parse_give_up, parse_port
from kernelflow.workflows.loader import is_agent_name

# The name this warning has always carried on stderr, from when this was the CLI's.
log = logging.getLogger("kernelflow.cli")


def register(subparsers: Any) -> None:
    daemon = subparsers.add_parser("daemon", help="long-running daemon hosting actor pools")
    add_connection_options(daemon, daemon=True)
    daemon.add_argument(
        "--roles", default=",".join(DEFAULT_ROLES), help="comma-separated roles to host"
    )
    daemon.add_argument(
        "--pool", action="append", default=[], metavar="ROLE=N", help="actors for a role"
    )
    daemon.add_argument("--llm", help=LLM_HELP)
    add_agent_llm_options(daemon)
    add_devices_option(daemon)
    daemon.add_argument(
        "--no-read-model", action="store_true", help="do not keep the status read model here"
    )
    daemon.add_argument(
        "--metrics-port",
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (env KF_METRICS_PORT; "
        "default: none; docs/observability.md)",
    )
    daemon.add_argument(
        "--metrics-host",
        metavar="ADDR",
        help="address the metrics listen on (env KF_METRICS_HOST; default 0.0.0.0: every "
        "interface)",
    )
    daemon.add_argument(
        "--nats-give-up",
        metavar="SECONDS",
        help="exit with status 1 once NATS has been unreachable this long, at start or later, "
        "for a supervisor to restart the daemon; 0: never (env KF_NATS_GIVE_UP; default 60)",
    )
    daemon.set_defaults(func=cmd_daemon)


def cmd_daemon(args: argparse.Namespace, settings: Settings) -> int:
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    if not roles:
        raise UsageError("--roles: name at least one role")
    for role in roles:
        if not is_agent_name(role):
            raise UsageError(
                f"--roles: {role!r} cannot name a role (letters, digits, '_' and '-'; not 'finish')"
            )
        if role not in DEFAULT_ROLES and (guess := did_you_mean(role, DEFAULT_ROLES, 0.8)):
            # A name this close to a built-in role is a typo, not a custom agent (agentflow's
            # memory_verifier is not that close): hosted, it would wait for work no workflow
            # gives it, and the role meant would be missing.
            raise UsageError(
                f"--roles: no role {role!r}{guess} (the roles: {', '.join(DEFAULT_ROLES)}, "
                "and the custom agents workflows name)"
            )
    pools = {}
    for item in args.pool:
        role, _, n = item.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"--pool {item!r}: expected ROLE=N with N ≥ 1")
        if role not in roles:  # a typo would leave the pool its default size, unnoticed
            raise UsageError(
                f"--pool {item!r}: this daemon does not host {role!r} (--roles "
                f"{','.join(roles)}){did_you_mean(role, roles)}"
            )
        pools[role] = int(n)
    devices = settings.devices
    if devices is not None and "verifier" in pools:
        if devices.kind == "gpus":
            raise UsageError(
                f"--devices {devices} gives one verifier per device: drop --pool verifier=N"
            )
        if devices.cpus is not None:
            raise UsageError(
                f"--devices {devices} says how many CPU verifiers there are: drop --pool "
                "verifier=N (or give --devices cpu, which takes that many)"
            )
    if devices is not None and devices.kind == "cpu" and "verifier" in roles:
        try:  # before anything connects: no more CPU verifiers than cores
            split_cores(usable_cores(), devices.cpus or pools.get("verifier", 1))
        except ValueError as exc:
            raise UsageError(f"--devices {devices}: {exc}") from None
    if args.nats_give_up is not None:
        settings.nats_give_up_s = parse_give_up(args.nats_give_up, "--nats-give-up")
    if args.metrics_port is not None:
        settings.metrics_port = parse_port(args.metrics_port, "--metrics-port")
    if args.metrics_host:
        settings.metrics_host = args.metrics_host
    daemon_id = new_daemon_id()
    # Before connecting: a metrics port in use ends the command at once.
    telemetry = start_telemetry(settings, roles, daemon_id)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        if stop.is_set():  # asked twice: stop now; what actors held is redone from the log
            raise KeyboardInterrupt
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    # Started once asked to stop; covers everything up to the exit (NATS closing included).
    deadline = threading.Timer(settings.stop_deadline_s, _stop_at_once, [settings.stop_deadline_s])
    deadline.daemon = True
    try:
        with connected(settings, stop.set, telemetry.after_append) as bridge:
            # An LLM endpoint not up yet is waited for, as NATS is: said, not fatal.
            daemon = start_daemon(
                bridge, settings, roles, pools, telemetry.on_message, llm_must_answer=False
            )
            # The status read model and the health responder (kernelflow status / health).
            read_model = None if args.no_read_model else ReadModel(bridge, daemon_id).start()
            telemetry.watch(bridge, daemon, read_model, daemon_id)
            sizes = {r: daemon.config.pool_size(r) for r in roles}
            describe = daemon_describer(
                daemon_id,
                bridge.nats_url,
                roles,
                sizes,
                daemon.config.llm,
                read_model,
                daemon.warm_ups,
            )
            health = HealthResponder(bridge, describe).start()
            print(
                f"kernelflow daemon on {safe_url(bridge.nats_url)}: roles {', '.join(roles)}",
                flush=True,
            )
            stop.wait()
            deadline.start()
            lost = bridge.lost
            if lost is None:
                grace = min(daemon.config.stop_timeout_s, settings.stop_deadline_s)
                print(
                    f"shutting down: actors finish what they hold (up to {grace:g}s; the whole "
                    f"stop up to {settings.stop_deadline_s:g}s); a second Ctrl-C (or SIGTERM) "
                    "stops at once, and the next daemon redoes their work from the log…",
                    flush=True,
                )
            health.stop()
            # Without NATS nothing the actors finish could be recorded: their work is the
            # next daemon's, as after a crash.
            daemon.stop(None if lost is None else ABANDONED_STOP_WAIT_S)
            if read_model is not None:
                read_model.stop()
            if lost is not None:
                raise lost  # one line on stderr, exit status 1 (kernelflow.cli)
    finally:
        deadline.cancel()
        telemetry.close()
    return EXIT_OK


def _stop_at_once(deadline_s: float) -> None:
    log.warning(
        "the stop did not finish within %gs (KF_STOP_DEADLINE): stopping at once, as on a "
        "second signal; the next daemon redoes whatever was unfinished",
        deadline_s,
    )
    os.kill(os.getpid(), signal.SIGTERM)  # the main thread's handler: KeyboardInterrupt
