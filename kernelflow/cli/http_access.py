"""Who may see the dashboard: with a token (``kernelflow ui --token-file``), only those
who show it.

A browser shows it once, as ``/?token=…``: the answer sets a session cookie that is not
the token itself (an HMAC of it) and sends the browser on to the same page without the
token, so it stays out of the address bar, the history and any log of requests. Programs
send ``Authorization: Bearer <token>``. ``/healthz`` (for probes) and ``/static/`` (the
page's own CSS and script, no data) are open. Comparisons take constant time.

Without a token the dashboard is open to whoever reaches its address, which is why it
listens on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelflow.cli.ui.html import HEADERS, problem_page
from kernelflow.host.exits import UsageError

__all__ = ["COOKIE", "TokenGate", "read_token"]

COOKIE = "kf_ui_session"
OPEN_PATHS = ("/healthz",)
OPEN_PREFIXES = ("/static/",)
MIN_TOKEN_CHARS = 16


def read_token(path: Path) -> str:
    """The token in ``path`` (its first line, stripped); a usage error where it cannot be
    read or is too short to be a secret."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UsageError(f"--token-file {path}: cannot read it: {why}") from None
    token = lines[0].strip() if lines else ""
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"--token-file {path}: the token must be at least {MIN_TOKEN_CHARS} characters "
            f"(make one: python -c 'import secrets; print(secrets.token_urlsafe(24))' > {path})"
        )
    return token


class TokenGate:
    """ASGI middleware: requests that do not show ``token`` get 401 (a page saying how to
    show it); see the module docstring."""

    def __init__(self, app: ASGIApp, token: str, where: str) -> None:
        self.app = app
        self.token = token.encode()
        self.session = hmac.new(self.token, b"kernelflow-ui-session", hashlib.sha256).hexdigest()
        self.where = where

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        shown = request.query_params.get("token")
        if shown is not None:
            response = self._signed_in(request) if self._is_token(shown) else self._refused()
        elif self._allowed(request):
            await self.app(scope, receive, send)
            return
        else:
            response = self._refused()
        await response(scope, receive, send)

    def _is_token(self, shown: str) -> bool:
        return hmac.compare_digest(shown.encode(), self.token)

    def _allowed(self, request: Request) -> bool:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self._is_token(credentials.strip()):
            return True
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self.session.encode())

    def _signed_in(self, request: Request) -> Response:
        """The same page without the token in its address, with the session cookie."""
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE, self.session, httponly=True, samesite="strict", path="/")
        return response

    def _refused(self) -> Response:
        text = (
            "This dashboard needs its token: open it as /?token=TOKEN, TOKEN being the "
            "contents of the token file kernelflow ui was started with (programs: send "
            "Authorization: Bearer TOKEN)."
        )
        return HTMLResponse(
            problem_page("token needed", text, self.where),
            401,
            {**HEADERS, "WWW-Authenticate": 'Bearer realm="kernelflow ui"'},
        )
