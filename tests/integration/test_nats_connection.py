"""How kernelflow reaches NATS (kernelflow.actors.connection): a list of servers, TLS with
a CA of one's own and client certificates, and the one line a user gets for each way it
can be set up wrong."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.host.nats_server import local_keys
from kernelflow.host.settings import Settings, SettingsError
from tests.conftest import creds as seed_file
from tests.conftest import role_auth, run_cli


def test_a_list_of_servers_is_tried_in_turn(nats_url: str) -> None:
    auth = role_auth(nats_url, "reader")
    bridge = Bridge(f"nats://127.0.0.1:9, {nats_url}", auth=auth).start(timeout_s=20)
    try:
        assert bridge.nc.is_connected
    finally:
        bridge.stop()


def test_tls_settings_need_a_server_given_by_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_NATS_URL", raising=False)
    monkeypatch.setenv("KF_NATS_TLS_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("KF_DATA_DIR", str(tmp_path))
    with pytest.raises(SettingsError, match="need a server given by URL"), Settings().nats():
        pass


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def signed(ca: Path, name: str, extension: str) -> tuple[Path, Path]:
    """A certificate for ``name`` signed by the test CA, and its key."""
    directory = ca.parent
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    ext = directory / f"{name}.ext"
    ext.write_text(extension + "\n")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", *curve, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl(
        "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", directory / "ca.key",
        "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, Path]]]:
    """A nats-server with kernelflow's users that speaks TLS only and verifies client
    certificates: its URL, the CA that signed its certificate, and a client's certificate
    and key (``cert``, ``key``) and daemon seed (``creds``)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test's certificates")
    ca = tmp_path / "ca.pem"
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", tmp_path / "ca.key", "-out", ca, "-days", "1",
            "-subj", "/CN=kernelflow test CA")  # fmt: skip
    server_cert, server_key = signed(ca, "server", "subjectAltName=IP:127.0.0.1")
    client_cert, client_key = signed(ca, "client", "extendedKeyUsage=clientAuth")
    keys = local_keys(tmp_path / "nats")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tls = {"cert_file": server_cert, "key_file": server_key, "ca_file": ca, "verify": True}
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f"jetstream: {json.dumps({'store_dir': str(tmp_path / 'store')})}\n"
        f"tls: {json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in tls.items()})}\n"
        + keys.server_authorization()
    )
    nats_server = Path(sys.executable).parent / "nats-server"
    with subprocess.Popen([nats_server, "-c", conf], stderr=subprocess.DEVNULL) as server:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "nats-server did not start"
                    time.sleep(0.1)
            client = {"cert": client_cert, "key": client_key, "creds": keys.seed_file("daemon")}
            yield f"tls://127.0.0.1:{port}", ca, client
        finally:
            server.terminate()
            server.wait(30)


def test_tls_with_a_ca_of_ones_own_and_a_client_certificate(
    tls_server: tuple[str, Path, dict[str, Path]], nats_url: str
) -> None:
    url, ca, client = tls_server
    creds = ("--creds", str(client["creds"]))
    certificate = ("--tls-cert", str(client["cert"]), "--tls-key", str(client["key"]))
    checked = run_cli(
        "health", "--json", "--no-daemons", "--nats-url", url, *creds, "--tls-ca", str(ca),
        *certificate,
    )  # fmt: skip
    assert checked.stderr == ""
    report = json.loads(checked.stdout)  # unhealthy: no daemon made the streams yet
    assert [c["status"] for c in report["checks"] if c["component"] in ("nats", "access")] == [
        "ok",
        "ok",
    ]
    assert report["access"] == {"auth_required": True, "tls": True, "creds": creds[1]}

    def refused(*args: str) -> str:
        result = run_cli("status", "--nats-url", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        return result.stderr

    assert "pass --tls-ca FILE" in refused(url, *creds, *certificate)  # an unknown CA
    assert "pass --tls-cert FILE" in refused(url, *creds, "--tls-ca", str(ca))  # no certificate
    assert "not a PEM certificate" in refused(url, *creds, "--tls-cert", str(client["key"]))
    # TLS asked for, from a server without: refused rather than spoken in plaintext.
    publisher = ("--creds", str(seed_file(nats_url, "publisher")))
    assert "does not offer it" in refused(nats_url, *publisher, "--tls-ca", str(ca))
