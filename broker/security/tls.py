"""TLS for a node's links: the SSL contexts of the client port, the peer links and the console.

With ``tls_cert`` and ``tls_key`` set, a node speaks TLS (1.2 or later) on all three:

* the client port serves its certificate; a client that presents one is checked against
  ``tls_ca`` when that is set (clients authenticate with a password, not a certificate);
* peer links (on unless ``peer_tls = "off"``) are mutual: each end presents its node
  certificate and checks the other's against ``tls_ca``, the dialling end also checks the
  peer's address against the certificate's names (SANs);
* the console serves HTTPS with the same certificate.

Contexts are built once per set of files (:func:`functools.lru_cache`); a file that is missing,
unreadable, not PEM, or a key that does not match its certificate is a :class:`ConfigError`
naming the file, raised when the node starts (:func:`check`).  :func:`peer_cert_names` gives the
names in a peer's verified certificate, to bind a link to the member it claims to be.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

from broker.config import ConfigError, NodeConfig
from client.clock import Clock

log = logging.getLogger("tandem.broker")


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path) -> None:
    for what, path in (("tls_cert", cert), ("tls_key", key)):
        if not path.is_file():
            raise ConfigError(f"{what} {path}: no such file")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"{what} {path}: cannot be read ({exc.strerror})") from None
    def encrypted() -> bytes:  # never prompt on the terminal: a node starts unattended
        raise ConfigError(f"tls_key {key} is encrypted: give the key unencrypted (readable by the node only, "
                          "mode 0600)")

    try:
        ctx.load_cert_chain(str(cert), str(key), password=encrypted)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ConfigError(f"tls_key {key} is not the key of the certificate in tls_cert {cert}") from None
        raise ConfigError(f"tls_cert {cert} / tls_key {key}: not a PEM certificate and its PEM private key "
                          f"({exc.reason or exc})") from None


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    if not ca.is_file():
        raise ConfigError(f"tls_ca {ca}: no such file")
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls_ca {ca}: not a readable PEM CA certificate ({getattr(exc, 'reason', None) or exc})") \
            from None


def _base(purpose: ssl._SSLMethod) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@functools.lru_cache(maxsize=16)
def _server(cert: Path, key: Path, ca: Path | None, require_client_cert: bool) -> ssl.SSLContext:
    ctx = _base(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, cert, key)
    if ca is not None:
        _load_ca(ctx, ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


@functools.lru_cache(maxsize=16)
def _peer_client(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    ctx = _base(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode CERT_REQUIRED, check_hostname on
    _load_chain(ctx, cert, key)
    _load_ca(ctx, ca)
    return ctx


def client_server_context(cfg: NodeConfig) -> ssl.SSLContext | None:
    """The client port's context: TLS only when the node has a certificate, else None."""
    if cfg.tls_cert is None or cfg.tls_key is None:
        return None
    return _server(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, False)


def console_context(cfg: NodeConfig) -> ssl.SSLContext | None:
    """The console's (HTTPS) context, or None for plain HTTP."""
    if cfg.tls_cert is None or cfg.tls_key is None:
        return None
    return _server(cfg.tls_cert, cfg.tls_key, None, False)


def _peer_files(cfg: NodeConfig) -> tuple[Path, Path, Path] | None:
    if not cfg.peer_tls_on:
        return None
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ConfigError("peer_tls = \"on\" needs tls_cert and tls_key (and tls_ca)")
    if cfg.tls_ca is None:
        raise ConfigError("TLS on peer links needs tls_ca: the CA certificate (PEM) every member's certificate "
                          "is signed by, so each node can check the others (--tls-ca, or tls_ca in the config; "
                          "`tandem certs dev DIR` makes one for local use), or peer_tls = \"off\" for "
                          "plaintext peer links")
    return cfg.tls_cert, cfg.tls_key, cfg.tls_ca


def peer_server_context(cfg: NodeConfig) -> ssl.SSLContext | None:
    """The peer port's context (mutual TLS: a member must present a certificate signed by
    ``tls_ca``), or None when peer links are plaintext."""
    files = _peer_files(cfg)
    return None if files is None else _server(*files, True)


def peer_client_context(cfg: NodeConfig) -> ssl.SSLContext | None:
    """The context this node dials its peers with (presents its certificate, checks theirs
    and their address), or None when peer links are plaintext."""
    files = _peer_files(cfg)
    return None if files is None else _peer_client(*files)


def peer_dial_tls(cfg: NodeConfig, host: str) -> dict[str, Any]:
    """The TLS arguments of :func:`asyncio.open_connection` to a peer at ``host``: none for
    plaintext peer links."""
    ctx = peer_client_context(cfg)
    return {} if ctx is None else {"ssl": ctx, "server_hostname": host}


def check(cfg: NodeConfig) -> None:
    """Build every context the node will use, so a bad file stops it at start with the file
    named; log a warning when certificates are set and peer links stay plaintext."""
    client_server_context(cfg)
    console_context(cfg)
    if cfg.peer_port is not None:
        peer_server_context(cfg)
        peer_client_context(cfg)
        if cfg.tls_cert is not None and not cfg.peer_tls_on:
            log.warning("peer_tls = \"off\": the peer links of %s are plaintext although it has a certificate; "
                        "the replication stream crosses the network in clear", cfg.name)


def peer_cert_names(writer: asyncio.StreamWriter) -> frozenset[str]:
    """The names in the verified certificate the other end of a TLS link presented: its
    subject's common names and its DNS subject alternative names.  Empty on a plaintext
    link or when no certificate was presented (the peer port requires one)."""
    cert = writer.get_extra_info("peercert")
    if not cert:
        return frozenset()
    names: set[str] = set()
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(value)
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "DNS":
            names.add(value)
    return frozenset(names)


class TlsServer:
    """A listening port whose connections are served over TLS, like
    ``asyncio.start_server(accept, host, port, ssl=ctx)`` except that a TLS handshake that fails
    (no certificate, one the CA did not sign, bytes that are not TLS, too slow) is reported as
    ``refused("host:port", why)``: asyncio itself only logs it at DEBUG level, and the peer
    port counts such links as intruders.  A connection closed before it finished a handshake
    without a TLS error (a port probe) is not reported.  Each accepted connection runs in a task
    kept in ``tasks`` (the caller cancels them when it stops)."""

    def __init__(self, accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                 refused: Callable[[str, str], None], ctx: ssl.SSLContext, *, handshake_timeout: float,
                 tasks: set[asyncio.Task[None]], clock: Clock) -> None:
        self._accept, self._refused, self._ctx, self._clock = accept, refused, ctx, clock
        self._timeout, self._tasks = handshake_timeout, tasks
        self.sockets: list[socket.socket] = []
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> TlsServer:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.create_server(addr[:2], family=family, backlog=128)
        sock.setblocking(False)
        self.sockets = [sock]
        self._loop_task = loop.create_task(self._serve(sock), name="tandem-tls-listen")
        return self

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as exc:
                if sock.fileno() == -1:
                    return  # closed
                log.warning("accepting a connection failed: %s", exc)
                await self._clock.sleep(0.1)  # (EMFILE and the like: do not spin)
                continue
            task = loop.create_task(self._one(conn, f"{peer[0]}:{peer[1]}"), name="tandem-tls-accept")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, conn: socket.socket, remote: str) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        proto = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: proto, conn, ssl=self._ctx,
                                                              ssl_handshake_timeout=self._timeout)
        except ssl.SSLError as exc:
            conn.close()
            self._refused(remote, f"TLS handshake failed: {exc.reason or exc}")
            return
        except (ConnectionAbortedError, TimeoutError):  # the handshake timeout
            conn.close()
            self._refused(remote, f"no TLS handshake within {self._timeout:g} s")
            return
        except OSError:
            conn.close()
            return  # it went away before a handshake: a port probe
        writer = asyncio.StreamWriter(transport, proto, reader, loop)
        await self._accept(reader, writer)

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        for s in self.sockets:
            s.close()

    async def wait_closed(self) -> None:
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
