"""``kernelflow serve-rewards``: the verifier pool's rewards over HTTP
(:mod:`kernelflow.cli.reward_server`; docs/verl.md, "Rewards over HTTP"), served by uvicorn
until SIGINT or SIGTERM. Every request goes through one ``RewardClient`` (one NATS
connection, at most ``--max-in-flight`` verifications in flight); it submits tasks and
reads the log, so the ``publisher`` role is what it needs.

Its own settings are read from the environment here (``KF_REWARDS_HOST``,
``KF_REWARDS_PORT``, ``KF_REWARDS_TOKEN_FILE``); the client's are every command's
(``KF_NATS_URL``..., ``KF_REWARD_MAX_IN_FLIGHT``, ``KF_REWARD_DEADLINE``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from kernelflow.actors.connection import safe_url
from kernelflow.cli.commands.options import add_connection_options
from kernelflow.cli.commands.ui import is_loopback, listening, serve
from kernelflow.host.exits import EXIT_OK, UsageError
from kernelflow.host.settings import Settings, SettingsError
from kernelflow.projections.rewards import KERNEL_REWARDS
from kernelflow.verification.backends import DEFAULT_BACKEND
from kernelflow.verification.policy import DEFAULT_POLICY, policy_names

DEFAULT_REWARDS_HOST = "127.0.0.1"
DEFAULT_REWARDS_PORT = 8787
# How long requests still open at a stop are given before they are cancelled (their
# tasks go on in the daemons, and a request made again is answered from the log).
_GRACEFUL_S = 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-rewards",
        help="serve the verifier pool's rewards over HTTP (OpenRLHF's --remote_rm_url, JSON)",
        description="Score responses on the daemons' verifier pool over HTTP: POST "
        "/get_reward (OpenRLHF's remote reward model), POST /v1/reward and /v1/rewards "
        "(JSON), GET /healthz. Needs daemons with a conductor and a verifier on the same NATS.",
    )
    p.add_argument(
        "--host",
        help=f"address to listen on (env KF_REWARDS_HOST; default {DEFAULT_REWARDS_HOST}: "
        "this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument(
        "--port",
        type=int,
        help=f"port to listen on (env KF_REWARDS_PORT; default {DEFAULT_REWARDS_PORT}; 0: any "
        "free one)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="answer only requests that send Authorization: Bearer <the token in FILE> (env "
        "KF_REWARDS_TOKEN_FILE); default: no token, whoever reaches the address may ask",
    )
    p.add_argument(
        "--backend",
        default=DEFAULT_BACKEND,
        help=f"the backend of requests that name none, all of OpenRLHF's (default "
        f"{DEFAULT_BACKEND})",
    )
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        choices=policy_names(),
        help=f"the verifier policy of requests that name none (default {DEFAULT_POLICY})",
    )
    p.add_argument(
        "--reward",
        default=KERNEL_REWARDS[0],
        help=f"the reward function of requests that name none: one of {', '.join(KERNEL_REWARDS)}"
        f" (default {KERNEL_REWARDS[0]})",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=3,
        help="the verifier's trials for requests that say none (default 3, as compute_score)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="the verifier's time limit per check, for requests that say none (default 300)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        metavar="N",
        help="verifications in flight at once; requests beyond wait (env "
        "KF_REWARD_MAX_IN_FLIGHT; default 64)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="how long a request waits for its reward before a 503 (env KF_REWARD_DEADLINE; "
        "default 900)",
    )
    add_connection_options(p)
    p.set_defaults(func=cmd_serve_rewards)


def cmd_serve_rewards(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: the web stack (the ``ui`` extra) is needed by this command only.
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401

        from kernelflow.cli.http_access import read_token
        from kernelflow.cli.reward_server import Defaults, check_defaults, create_app
        from kernelflow.rewards import RewardClient
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("uvicorn", "starlette"):
            raise
        raise UsageError(
            f"kernelflow serve-rewards needs {exc.name}: pip install 'kernelflow[ui]'"
        ) from None
    defaults = Defaults(
        backend=args.backend,
        policy=args.policy,
        reward=args.reward,
        trials=args.trials,
        timeout_s=args.timeout,
    )
    try:
        check_defaults(defaults)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    max_in_flight = args.max_in_flight or settings.reward_max_in_flight
    deadline_s = args.deadline or settings.reward_deadline_s
    if max_in_flight < 1:
        raise UsageError(f"--max-in-flight {max_in_flight}: expected 1 or more")
    if deadline_s <= 0:
        raise UsageError(f"--deadline {deadline_s:g}: expected seconds > 0")
    host = args.host or os.environ.get("KF_REWARDS_HOST") or DEFAULT_REWARDS_HOST
    port = args.port if args.port is not None else _env_port()
    token_file = args.token_file or _env_path("KF_REWARDS_TOKEN_FILE")
    token = read_token(token_file) if token_file else None
    client = RewardClient(settings, max_in_flight=max_in_flight, deadline_s=deadline_s)
    with contextlib.closing(listening(host, port)) as sock, contextlib.closing(client):
        bridge = client.start()  # NATS is reached before the address is said
        where = f"NATS {safe_url(bridge.nats_url)}"
        app = create_app(client, defaults, token=token)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host

        def announce() -> None:
            asks = "; send Authorization: Bearer <the token>" if token else ""
            print(
                f"kernelflow serve-rewards: http://{shown}:{bound_port}/ ({where}; backend "
                f"{defaults.backend}, policy {defaults.policy}, reward {defaults.reward}, at most "
                f"{max_in_flight} in flight{asks})",
                flush=True,
            )
            if token is None and not is_loopback(host):
                print(
                    "kernelflow serve-rewards: warning: no --token-file: whoever reaches "
                    f"{shown}:{bound_port} may run code on the verifier pool",
                    file=sys.stderr,
                    flush=True,
                )

        serve(app, sock, verbose=bool(args.verbose), announce=announce, graceful_s=_GRACEFUL_S)
    return EXIT_OK


def _env_port() -> int:
    raw = os.environ.get("KF_REWARDS_PORT")
    if not raw:
        return DEFAULT_REWARDS_PORT
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"KF_REWARDS_PORT={raw!r}: expected a port number") from None


def _env_path(name: str) -> Path | None:
    raw = os.environ.get(name)
    return Path(raw) if raw else None
