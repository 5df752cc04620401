"""TLS on the client side (``tandems://``): the SSL context a link is opened with, and what a
failed TLS handshake (or a node that expects one) means, told in one clear line.

The context checks the node's certificate against the system's trusted CAs, or against the
CA file of the URL's ``ca`` option (``tandems://admin@h1:7780?ca=/etc/tandem/ca.crt``), and
checks that the certificate names the host dialled (its DNS or IP subject alternative
names).  An application may give its own context instead (``ssl_context=`` of
:func:`client.connect`, :func:`client.connect_link`, :func:`client.blocking.connect`).
"""

from __future__ import annotations

import functools
import ssl

from client.errors import ConnectionClosedError, InvalidArgumentError, TandemError


class TlsError(TandemError):
    """The TLS handshake with a node failed for a reason trying again will not fix (its
    certificate is not trusted, or does not name the host)."""

    code = ConnectionClosedError.code


@functools.lru_cache(maxsize=8)
def default_context(ca: str | None) -> ssl.SSLContext:
    """TLS 1.2+, the node's certificate checked against ``ca`` (a PEM file) or the system's
    trusted CAs, and its names against the host dialled."""
    if ca is None:
        ctx = ssl.create_default_context()
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the certificate and the host name
        try:
            ctx.load_verify_locations(cafile=ca)
        except FileNotFoundError:
            raise InvalidArgumentError(f"TLS CA file {ca}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgumentError(f"TLS CA file {ca}: not a readable PEM CA certificate "
                                       f"({getattr(exc, 'reason', None) or exc})") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def handshake_error(host: str, port: int, exc: BaseException) -> TandemError:
    """What a TLS handshake that raised ``exc`` means to the user."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsError(f"node at {host}:{port}: its TLS certificate is not accepted: "
                        f"{exc.verify_message or exc.reason} (give the CA it is signed by with "
                        f"?ca=/path/ca.pem in the URL)")
    if isinstance(exc, ssl.SSLError) and exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE",
                                                         "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL"):
        return TlsError(f"node at {host}:{port} does not speak TLS (use tandem://): {exc.reason}")
    return ConnectionClosedError(f"node at {host}:{port}: the TLS handshake failed ({exc}); it may not speak "
                                 "TLS (use tandem://)")


def plaintext_refused(host: str, port: int) -> ConnectionClosedError:
    """A plaintext link the node closed before its first answer: most likely a TLS-only port."""
    return ConnectionClosedError(f"node at {host}:{port} closed the connection during the handshake: "
                                 "it may expect TLS (use tandems://)")
