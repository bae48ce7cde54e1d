"""``kernelflow ui --token-file``: run as a subprocess against a real NATS, asked over HTTP
as a stranger, a browser and a program would: no page or live stream answers without the
token, a wrong token is refused, a browser that shows it once gets a session cookie and an
address without it, and the token appears nowhere in what the command prints."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import as_user, cli_env, keyed_nats, run_cli
from tests.daemons import serving_ui

pytest.importorskip("uvicorn")

TOKEN = "kf-ui-token-0123456789abcdef"
GUARDED = ("/", "/tasks/t1", "/groups/g", "/run", "/bench/b", "/stream", "/stream/run")


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with keyed_nats(tmp_path_factory.mktemp("ui-token-nats")) as url:
        yield url


@pytest.fixture(scope="module")
def guarded(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A dashboard asking for TOKEN: its address, and the first line it printed."""
    tmp = tmp_path_factory.mktemp("ui-token")
    token_file = tmp / "ui.token"
    token_file.write_text(TOKEN + "\n")
    with serving_ui(nats_url, tmp, "--token-file", str(token_file)) as server:
        yield server.url, server.first_line
    assert TOKEN not in server.printed  # the token is never printed, nor logged


def get(base: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    address = urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    if response.getheader("content-type", "").startswith("text/event-stream"):
        response.fp.readline()  # the stream is open: that is all this needs to know
    else:
        response.read()
    connection.close()
    return response


def test_nothing_but_health_and_static_files_answers_without_the_token(
    guarded: tuple[str, str],
) -> None:
    base, line = guarded
    assert "/?token=<the token in" in line and TOKEN not in line
    for path in GUARDED:
        response = get(base, path)
        assert response.status == 401, path
        assert response.getheader("www-authenticate", "").startswith("Bearer")
    assert get(base, "/healthz").status == 200
    assert get(base, "/static/ui.js").status == 200
    for wrong in ("Bearer " + TOKEN[:-1], "Bearer " + TOKEN + "x", "Basic " + TOKEN, TOKEN):
        assert get(base, "/", {"Authorization": wrong}).status == 401, wrong
    assert get(base, "/?token=" + TOKEN[:-1]).status == 401
    assert get(base, "/", {"Cookie": "kf_ui_session=" + TOKEN}).status == 401


def test_a_program_shows_the_token_as_a_bearer(guarded: tuple[str, str]) -> None:
    base, _ = guarded
    for path in ("/", "/run", "/stream"):
        response = get(base, path, {"Authorization": "Bearer " + TOKEN})
        assert response.status == 200, path


def test_a_browser_shows_it_once_and_keeps_a_session_without_it(guarded: tuple[str, str]) -> None:
    base, _ = guarded
    signed_in = get(base, f"/?status=running&token={TOKEN}")
    assert signed_in.status == 303
    assert signed_in.getheader("location") == "/?status=running"  # the token left behind
    cookie = signed_in.getheader("set-cookie", "")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
    session = cookie.split(";")[0]
    assert get(base, "/?status=running", {"Cookie": session}).status == 200
    assert get(base, "/stream", {"Cookie": session}).status == 200  # the live updates too


def test_a_token_file_that_cannot_be_one_is_one_line(nats_url: str, tmp_path: Path) -> None:
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    for args, said in (
        (["--token-file", str(tmp_path / "missing")], "cannot read it"),
        (["--token-file", str(short)], "at least 16 characters"),
    ):
        result = run_cli("ui", "--port", "0", *as_user("reader", nats_url), *args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert said in result.stderr
    by_env = run_cli(
        "ui", "--port", "0", *as_user("reader", nats_url), env=cli_env(KF_UI_TOKEN_FILE=str(short))
    )
    assert by_env.returncode == 2 and "at least 16 characters" in by_env.stderr


def test_serving_beyond_this_machine_without_a_token_is_said(nats_url: str, tmp_path: Path) -> None:
    with serving_ui(nats_url, tmp_path, "--host", "0.0.0.0") as everywhere:
        pass
    assert "warning: no --token-file: the log is shown to whoever reaches" in everywhere.printed
    with serving_ui(nats_url, tmp_path) as loopback:  # 127.0.0.1: nothing to warn of
        pass
    assert "warning" not in loopback.printed


def test_the_access_log_never_shows_the_token(nats_url: str, tmp_path: Path) -> None:
    token_file = tmp_path / "ui.token"
    token_file.write_text(TOKEN + "\n")
    with serving_ui(nats_url, tmp_path, "--token-file", str(token_file), verbose=True) as server:
        assert get(server.url, f"/?a=1&token={TOKEN}&b=2").status == 303
        assert get(server.url, "/?token=" + TOKEN + "x").status == 401
        assert get(server.url, "/healthz").status == 200
    assert "GET /healthz" in server.printed  # the access log is on
    assert "token=[redacted]" in server.printed and TOKEN not in server.printed
