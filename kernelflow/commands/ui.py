"""``kernelflow ui``: the live web dashboard (kernelflow.ui), served by uvicorn until
SIGINT or SIGTERM. It reads the log and asks the daemons' read model over NATS with the
connection options of every command, so any role that may read the log (``reader``,
``publisher``) will do."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
from typing import Any

from kernelflow.actors.connection import safe_url
from kernelflow.commands.options import add_connection_options
from kernelflow.runtime import connected
from kernelflow.settings import DEFAULT_UI_PORT, Settings
from kernelflow.usage import EXIT_OK, UsageError


def register(subparsers: Any) -> None:
    ui = subparsers.add_parser("ui", help="serve the live web dashboard of the tasks and the log")
    ui.add_argument(
        "--host",
        help="address to listen on (env KF_UI_HOST; default 127.0.0.1: this machine only; "
        "0.0.0.0: every interface)",
    )
    ui.add_argument(
        "--port",
        type=int,
        help=f"port to listen on (env KF_UI_PORT; default {DEFAULT_UI_PORT}; 0: any free one)",
    )
    add_connection_options(ui)
    ui.set_defaults(func=cmd_ui)


def listening(host: str, port: int) -> socket.socket:
    """The server's socket, bound before NATS is reached: a port that is taken is said at
    once, in one line."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number, 0 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: the web stack (the ``ui`` extra) is needed by this command only.
    try:
        import uvicorn

        from kernelflow.ui.app import create_app
        from kernelflow.ui.data import LogView
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("uvicorn", "starlette"):
            raise
        raise UsageError(f"kernelflow ui needs {exc.name}: pip install 'kernelflow[ui]'") from None
    host = args.host or settings.ui_host
    port = args.port if args.port is not None else settings.ui_port
    with contextlib.closing(listening(host, port)) as sock, connected(settings) as bridge:
        where = f"NATS {safe_url(bridge.nats_url)}"
        app = create_app(LogView(bridge), where=f"kernelflow ui · reading the log on {where}")
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        print(f"kernelflow ui: http://{shown}:{bound_port}/ ({where})", flush=True)
        config = uvicorn.Config(
            app,
            log_config=None,  # the CLI's logging (-v: info)
            access_log=bool(args.verbose),
            timeout_graceful_shutdown=2,  # open live streams end with the server
            lifespan="off",
        )
        server = uvicorn.Server(config)

        def stop(*_: object) -> None:
            server.should_exit = True

        # uvicorn stops on these itself, then raises the signal again once stopped: this
        # handler is what hears it then, so that the command ends as the daemon does (0).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        server.run(sockets=[sock])
    return EXIT_OK
