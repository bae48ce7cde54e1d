"""``kernelflow ui``: the live web dashboard (kernelflow.cli.ui), served by uvicorn until
SIGINT or SIGTERM. It reads the log and asks the daemons' read model over NATS with the
connection options of every command, so any role that may read the log (``reader``,
``publisher``) will do."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from kernelflow.actors.connection import safe_url
from kernelflow.cli.commands.options import add_connection_options
from kernelflow.host.exits import EXIT_OK, UsageError
from kernelflow.host.runtime import connected
from kernelflow.host.settings import DEFAULT_UI_PORT, Settings
from kernelflow.host.stopping import StopDeadline


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
    ui.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="ask every visitor for the token in FILE (env KF_UI_TOKEN_FILE; a browser opens "
        "/?token=TOKEN once, programs send Authorization: Bearer TOKEN); default: no token, "
        "the dashboard shows the log to whoever reaches it",
    )
    add_connection_options(ui)
    ui.set_defaults(func=cmd_ui)


_TOKEN_IN_QUERY = re.compile(r"([?&]token=)[^&\s\"]*")


def redact_tokens(record: logging.LogRecord) -> bool:
    """A logging filter for the access log (``-v``): a sign-in's ``?token=`` never reaches
    it (uvicorn logs each request's path with its query)."""
    if isinstance(record.args, tuple):
        record.args = tuple(
            _TOKEN_IN_QUERY.sub(r"\1[redacted]", a) if isinstance(a, str) else a
            for a in record.args
        )
    record.msg = _TOKEN_IN_QUERY.sub(r"\1[redacted]", str(record.msg))
    return True


def is_loopback(host: str) -> bool:
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback
            for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        )
    except (socket.gaierror, ValueError):
        return False


def listening(host: str, port: int) -> socket.socket:
    """The server's socket, listening before NATS is reached: a port that is taken is said
    at once, in one line."""
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
        sock.listen(socket.SOMAXCONN)  # connections wait from now on, not from uvicorn's start
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def serve(
    app: Any,
    sock: socket.socket,
    *,
    verbose: bool,
    announce: Callable[[], None],
    graceful_s: int,
) -> None:
    """Serve the ASGI ``app`` with uvicorn on the listening ``sock`` until SIGINT or
    SIGTERM (requests still open ``graceful_s`` seconds later are cancelled).
    ``announce`` says where it serves, once a stop signal is heard as one: a supervisor
    may stop it at once. From the first signal the whole stop (the server's, then what
    the caller closes after) has its deadline, and a second one ends the command at once."""
    import uvicorn

    config = uvicorn.Config(
        app,
        log_config=None,  # the CLI's logging (-v: info)
        access_log=verbose,
        timeout_graceful_shutdown=graceful_s,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    logging.getLogger("uvicorn.access").addFilter(redact_tokens)
    deadline = StopDeadline()
    uvicorns = server.handle_exit
    unanswered: list[int] = []  # the signals uvicorn heard, which it raises again

    def stopping(sig: int, frame: FrameType | None) -> None:
        deadline.asked()
        unanswered.append(sig)
        uvicorns(sig, frame)

    server.handle_exit = stopping  # type: ignore[method-assign]

    def stopped(*_: object) -> None:
        # uvicorn raises the signals it heard again once it stopped: those end the
        # command as the daemon ends (0); one more is a second signal.
        if unanswered:
            unanswered.pop()
        else:
            server.should_exit = True
            deadline.asked()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)
    announce()
    server.run(sockets=[sock])


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: the web stack (the ``ui`` extra) is needed by this command only.
    try:
        import uvicorn  # noqa: F401  (serve's)

        from kernelflow.cli.http_access import read_token
        from kernelflow.cli.ui.app import create_app
        from kernelflow.cli.ui.data import LogView
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("uvicorn", "starlette"):
            raise
        raise UsageError(f"kernelflow ui needs {exc.name}: pip install 'kernelflow[ui]'") from None
    host = args.host or settings.ui_host
    port = args.port if args.port is not None else settings.ui_port
    token_file = args.token_file or settings.ui_token_file
    token = read_token(token_file) if token_file else None
    with contextlib.closing(listening(host, port)) as sock, connected(settings) as bridge:
        where = f"NATS {safe_url(bridge.nats_url)}"
        footer = f"kernelflow ui · reading the log on {where}"
        app = create_app(LogView(bridge), where=footer, token=token)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host

        def announce() -> None:
            asks = f"; open it once as /?token=<the token in {token_file}>" if token else ""
            print(f"kernelflow ui: http://{shown}:{bound_port}/ ({where}{asks})", flush=True)
            if token is None and not is_loopback(host):
                print(
                    f"kernelflow ui: warning: no --token-file: the log is shown to whoever "
                    f"reaches {shown}:{bound_port}",
                    file=sys.stderr,
                    flush=True,
                )

        # Open live streams end with the server.
        serve(app, sock, verbose=bool(args.verbose), announce=announce, graceful_s=2)
    return EXIT_OK
