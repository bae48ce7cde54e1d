"""How a kernelflow process reaches NATS: the servers (one URL, or a comma-separated list
of a cluster's), the credentials it proves who it is with (an nkey seed file, as
``kernelflow creds`` writes, or a NATS ``.creds`` file) and TLS (a CA to trust, a client
certificate); and what a server's refusal means, in one line.

A client with an nkey takes its replies on an inbox of its own, ``_INBOX.<public key>.``
(``inbox_prefix``): kernelflow's roles let each user subscribe there and nowhere else
under ``_INBOX`` (kernelflow.host.nats_auth), so no user sees the replies another gets.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import nkeys

# What a .creds file (a user JWT and its seed, from an operator-mode deployment) holds.
_JWT_MARK = "BEGIN NATS USER JWT"


class CredentialsError(ValueError):
    """A credentials or TLS file that cannot be used: what is wrong with it (never what it
    holds)."""


class NatsAccessRefused(ConnectionError):
    """The server would not let this client in: its credentials or TLS."""


class BadNatsUrl(ValueError):
    """A NATS URL that names no server a client could connect to: what is wrong with it."""


# The schemes a NATS client speaks (nats-py's): a URL without one is nats://.
_SCHEMES = ("nats", "tls", "ws", "wss")


def check_nats_url(url: str) -> None:
    """Raise BadNatsUrl, saying what is wrong, unless ``url`` (one URL, or a
    comma-separated list of a cluster's) names servers a NATS client can connect to: a
    known scheme, a host and a port from 1 to 65535 each, websocket and plain URLs not
    mixed. Checked before connecting, where nats-py would fail with its internals."""
    servers = server_urls(url)
    if not servers:
        raise BadNatsUrl(f"{_no_userinfo(url)!r} names no NATS server (e.g. nats://127.0.0.1:4222)")
    schemes = {_check_server_url(one) for one in servers}
    if len(schemes & {"ws", "wss"}) and len(schemes - {"ws", "wss"}):
        raise BadNatsUrl(
            f"{_no_userinfo(url)!r}: websocket (ws://, wss://) and NATS URLs cannot be mixed"
        )


def _check_server_url(one: str) -> str:
    """One server's URL checked (``check_nats_url``); its scheme."""
    what = f"NATS URL {_no_userinfo(one)!r}"
    try:
        parts = urlsplit(one if "://" in one else f"nats://{one}")
    except ValueError:  # "[::1": urlsplit's only complaint
        raise BadNatsUrl(f"{what}: an IPv6 address without its closing ']'") from None
    if parts.scheme not in _SCHEMES:
        raise BadNatsUrl(
            f"{what}: {parts.scheme}:// is not a NATS scheme (nats://, tls://, ws://, wss://)"
        )
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # "host:4222x", "host:99999"
        port_text = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise BadNatsUrl(f"{what}: port {port_text!r} is not a number from 1 to 65535") from None
    if not host:
        raise BadNatsUrl(f"{what}: no host (e.g. nats://127.0.0.1:4222)")
    if port == 0:
        raise BadNatsUrl(f"{what}: port 0 is not a number from 1 to 65535")
    return parts.scheme


def _no_userinfo(url: str) -> str:
    """``url`` (one or a list) without user-info, for an error: never a password shown."""
    return re.sub(r"//[^/@,]*@", "//", url)


def safe_url(url: str) -> str:
    """A NATS URL (or comma-separated list) as it may be shown: without credentials."""
    out = []
    for one in server_urls(url):
        parts = urlsplit(one)
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        out.append(urlunsplit((parts.scheme, netloc, parts.path, "", "")))
    return ",".join(out)


def server_urls(url: str) -> list[str]:
    """The servers of ``url``: one URL, or a comma-separated list of a cluster's."""
    return [one.strip() for one in url.split(",") if one.strip()]


def inbox_prefix(public_key: str) -> str:
    """Where the user with nkey ``public_key`` takes its replies."""
    return f"_INBOX.{public_key}"


def public_key_of(seed: bytes) -> str:
    """The public key (``U…``) of a user's nkey seed (``SU…``); CredentialsError if it is
    not one."""
    if not seed.startswith(b"SU"):
        raise CredentialsError("not an nkey user seed (SU…) nor a NATS .creds file")
    try:
        pair = nkeys.from_seed(bytearray(seed))
    except nkeys.NkeysError:
        raise CredentialsError("not a valid nkey seed") from None
    try:
        return str(pair.public_key.decode())
    finally:
        pair.wipe()


@dataclass(frozen=True)
class ClientAuth:
    """What a client presents to the server; all None: nothing (a server without auth)."""

    creds: Path | None = None  # an nkey seed file or a .creds file
    tls_ca: Path | None = None  # CA certificates to trust (default: the system's)
    tls_cert: Path | None = None  # a client certificate (mutual TLS), with its key
    tls_key: Path | None = None  # the certificate's key, where it is not in tls_cert

    @property
    def tls(self) -> bool:
        return any((self.tls_ca, self.tls_cert, self.tls_key))

    def options(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` for these credentials and TLS settings.
        Raises CredentialsError naming a file that cannot be used."""
        options: dict[str, Any] = {}
        if self.creds is not None:
            options |= _credentials(self.creds)
        if self.tls:
            options["tls"] = self._tls_context()
        return options

    def _tls_context(self) -> ssl.SSLContext:
        if self.tls_key is not None and self.tls_cert is None:
            raise CredentialsError(f"TLS key {self.tls_key}: a key needs its certificate too")
        try:
            context = ssl.create_default_context(cafile=str(self.tls_ca) if self.tls_ca else None)
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"TLS CA file {self.tls_ca}: {_why(exc)}") from None
        if self.tls_cert is not None:
            try:
                context.load_cert_chain(
                    str(self.tls_cert), str(self.tls_key) if self.tls_key else None
                )
            except ssl.SSLError:
                raise CredentialsError(
                    f"TLS certificate {self.tls_cert}: not a PEM certificate with its key "
                    "(--tls-key), or the key is not the certificate's"
                ) from None
            except OSError as exc:
                raise CredentialsError(f"TLS certificate {self.tls_cert}: {_why(exc)}") from None
        return context


class NatsEndpoint(NamedTuple):
    """A NATS to use: where it is, and what to present to it."""

    url: str
    auth: ClientAuth


def _credentials(path: Path) -> dict[str, Any]:
    """``nats.connect`` arguments for a credentials file: nats-py reads the file itself
    on every (re)connect, so it is only checked here, and the seed kept nowhere."""
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"NATS credentials {path}: {_why(exc)}") from None
    if _JWT_MARK.encode() in content:
        return {"user_credentials": str(path)}
    try:
        key = public_key_of(content.strip())
    except CredentialsError as exc:
        raise CredentialsError(f"NATS credentials {path}: {exc}") from None
    return {"nkeys_seed": str(path), "inbox_prefix": inbox_prefix(key)}


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def tls_wanted(url: str, auth: ClientAuth) -> bool:
    """Whether this client must not talk to the server in plaintext: it was given TLS
    settings, or a ``tls://`` URL."""
    return auth.tls or any(urlsplit(u).scheme == "tls" for u in server_urls(url))


def check_tls(server_info: dict[str, Any] | None, url: str, auth: ClientAuth) -> None:
    """Refuse a connection made in plaintext where TLS was asked for (nats-py goes on in
    plaintext with a server that does not offer TLS, even for a ``tls://`` URL), from
    what the server said of itself when the client connected (its INFO)."""
    if tls_wanted(url, auth) and not (server_info or {}).get("tls_required"):
        raise NatsAccessRefused(
            f"TLS was asked for, but the NATS server at {safe_url(url)} does not offer it "
            "(configure tls {…} on the server, or drop the TLS settings)"
        )


def refusal(exc: BaseException, url: str, auth: ClientAuth) -> str | None:
    """One line saying why the server at ``url`` refused this client, if ``exc`` (an
    error while connecting) is such a refusal; None for anything else (unreachable...)."""
    text, shown = str(exc).lower(), safe_url(url)
    if "authorization violation" in text or "authorization failed" in text:
        if auth.creds:
            presented = f"the credentials in {auth.creds}"
        elif any(urlsplit(u).username for u in server_urls(url)):
            presented = "the URL's user and password"
        else:
            presented = "no credentials"
        return (
            f"the NATS server at {shown} refused {presented} (authorization violation): "
            "pass --creds FILE (or set KF_NATS_CREDS) with credentials it knows"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS with the NATS server at {shown} failed: {exc.verify_message}; "
            "pass --tls-ca FILE (or KF_NATS_TLS_CA) with the CA that signed its certificate"
        )
    if isinstance(exc, ssl.SSLError):
        why = f"TLS with the NATS server at {shown} failed: {exc.reason or exc}"
        if "CERTIFICATE_REQUIRED" in str(exc.reason):
            why += "; it verifies clients: pass --tls-cert FILE (or KF_NATS_TLS_CERT)"
        return why
    return None
