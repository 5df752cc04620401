"""Parsing of Tandem URLs: ``tandem://user:password@host:port[,host:port...]/?name=...``.

``tandems://`` is the same over TLS: the node's certificate is checked against the
system's trusted CAs, or the CA file of the ``ca`` option, and must name the host
dialled (:mod:`client.tls`).

The password may be left out of the URL and given in ``TANDEM_PASSWORD``.
Query options: ``name`` (client name shown in broker logs), ``heartbeat``
(seconds; 0 disables), ``connect_timeout`` (seconds), ``ca`` (tandems:// only: a PEM
file of the CA the nodes' certificates are signed by).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, unquote

from client.errors import InvalidArgumentError
from client.tls import default_context

DEFAULT_PORT = 7780


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectParams:
    hosts: tuple[tuple[str, int], ...]
    user: str
    password: str = field(repr=False)  # (an application that logs its params logs no password)
    client_name: str = "tandem-python"
    heartbeat: float = 10.0
    connect_timeout: float = 10.0
    tls: bool = False  # tandems://
    ca: str | None = None  # PEM CA file the nodes' certificates are checked against (else the system's)
    #: the application's own TLS context (replaces ``ca`` and the default one)
    ssl_context: ssl.SSLContext | None = None
    observe: bool = False  # a monitoring session (client.protocol.frames.Hello.observe)

    def context(self) -> ssl.SSLContext | None:
        """The TLS context links are opened with (None: plaintext, tandem://)."""
        if not self.tls:
            return None
        return self.ssl_context or default_context(self.ca)


def format_url(params: ConnectParams, hosts: str | None = None, *, query: dict[str, str] | None = None) -> str:
    """A URL with ``params``' scheme, credentials and CA for ``hosts`` ("h1:p1,h2:p2"; default:
    the params' own); ``query``: further options."""
    if hosts is None:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in params.hosts)
    opts = dict(query or {})
    if params.tls and params.ca:
        opts["ca"] = params.ca
    q = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in opts.items())
    return (f"{'tandems' if params.tls else 'tandem'}://{quote(params.user, safe='')}:"
            f"{quote(params.password, safe='')}@{hosts}" + (f"/?{q}" if q else ""))


def redacted(url: str) -> str:
    """``url`` with the password of its ``user:password@`` replaced by ``***``: for error
    messages, which applications log."""
    scheme, sep, rest = url.rpartition("://")
    rest, q, query = rest.partition("?")
    cred, at, hosts = rest.rpartition("@")
    if not at or ":" not in cred:
        return url
    return f"{scheme}{sep}{cred.split(':', 1)[0]}:***@{hosts}{q}{query}"


def parse_url(url: str) -> ConnectParams:
    if "://" not in url:
        raise InvalidArgumentError(f"not a Tandem URL: {redacted(url)!r} (expected tandem://user:password@host:port)")
    scheme, rest = url.split("://", 1)
    if scheme not in ("tandem", "tandems"):
        raise InvalidArgumentError(f"unknown URL scheme {scheme!r} (use tandem:// or tandems://)")
    rest, _, query = rest.partition("?")
    rest = rest.rstrip("/")
    user, password = "admin", None
    if "@" in rest:
        cred, rest = rest.rsplit("@", 1)
        user, sep, pw = cred.partition(":")
        user = unquote(user) or "admin"
        password = unquote(pw) if sep else None
    if password is None:
        password = os.environ.get("TANDEM_PASSWORD", "")
    hosts = []
    for part in rest.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [ipv6]:port
            host, _, port = part[1:].partition("]")
            port = port.lstrip(":") or str(DEFAULT_PORT)
        elif ":" in part:
            host, _, port = part.rpartition(":")
        else:
            host, port = part, str(DEFAULT_PORT)
        try:
            port_n = int(port)
        except ValueError:
            raise InvalidArgumentError(f"bad port {port!r} in URL") from None
        if not 0 < port_n < 65536:
            raise InvalidArgumentError(f"port {port_n} out of range in URL")
        hosts.append((host or "127.0.0.1", port_n))
    if not hosts:
        raise InvalidArgumentError(f"no host in URL {redacted(url)!r}")
    opts = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(opts) - {"name", "heartbeat", "connect_timeout", "ca"}
    if unknown:
        raise InvalidArgumentError(f"unknown URL option(s): {', '.join(sorted(unknown))}")
    if "ca" in opts and scheme != "tandems":
        raise InvalidArgumentError("URL option ca: only with tandems:// (TLS)")
    try:
        heartbeat = float(opts.get("heartbeat", 10.0))
        connect_timeout = float(opts.get("connect_timeout", 10.0))
    except ValueError:
        raise InvalidArgumentError("heartbeat and connect_timeout must be numbers") from None
    return ConnectParams(hosts=tuple(hosts), user=user, password=password,
                         client_name=opts.get("name", "tandem-python"), heartbeat=heartbeat,
                         connect_timeout=connect_timeout, tls=scheme == "tandems", ca=opts.get("ca") or None)
