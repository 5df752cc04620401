"""SCRAM-SHA-256 (RFC 5802, RFC 7677): the math and the messages, for both ends.

The client proves it knows the password without sending it, and the node proves
it holds the user's credentials (a fake node cannot).  The node stores per user
only ``salt``, ``iterations``, ``StoredKey`` and ``ServerKey``; none of them lets
anyone log in (``StoredKey`` is a hash of ``ClientKey``, which only the password
yields).  No channel binding (gs2 header ``n,,``).

    SaltedPassword  = PBKDF2-HMAC-SHA-256(SASLprep(password), salt, iterations)
    ClientKey       = HMAC(SaltedPassword, "Client Key")
    StoredKey       = SHA-256(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare + "," + server-first + "," + client-final-without-proof
    ClientProof     = ClientKey XOR HMAC(StoredKey, AuthMessage)
    ServerSignature = HMAC(ServerKey, AuthMessage)

The messages, as the RFC writes them (and as they travel in the Hello,
AuthChallenge, AuthResponse and Welcome frames)::

    client-first   n,,n=<user>,r=<client nonce>
    server-first   r=<client nonce + server nonce>,s=<base64 salt>,i=<iterations>
    client-final   c=biws,r=<nonce>,p=<base64 ClientProof>
    server-final   v=<base64 ServerSignature>

Written with the standard library (hashlib.pbkdf2_hmac, hmac): the exchange is
small, and the SDK keeps a cache of SaltedPassword per (user, salt, iterations),
where a packaged client (scramp) takes the password and salts it on every
exchange.  Nothing here does I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass

from client.errors import AuthError

MECHANISM = "SCRAM-SHA-256"
#: iterations of PBKDF2 for new credentials (RFC 7677 asks for at least 4096); each user's
#: count is stored with it, so raising this changes only passwords set from then on
DEFAULT_ITERATIONS = 100_000
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 10_000_000  # a node asking for more is not believed (it would stall the client)
_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"


# -- the math ------------------------------------------------------------------------------


def saslprep(password: str) -> str:
    """RFC 4013 SASLprep of a password: non-ASCII spaces become spaces, "commonly mapped to
    nothing" characters go, NFKC; prohibited characters are an error."""
    if password.isascii():
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in password):
            raise AuthError("the password contains a control character")
        return password
    mapped = "".join(" " if stringprep.in_table_c12(c) else c for c in password
                     if not stringprep.in_table_b1(c))
    out = unicodedata.normalize("NFKC", mapped)
    for c in out:
        if (stringprep.in_table_c12(c) or stringprep.in_table_c21_c22(c) or stringprep.in_table_c3(c)
                or stringprep.in_table_c4(c) or stringprep.in_table_c5(c) or stringprep.in_table_c6(c)
                or stringprep.in_table_c7(c) or stringprep.in_table_c8(c) or stringprep.in_table_c9(c)):
            raise AuthError(f"the password contains a character SASLprep prohibits (U+{ord(c):04X})")
    if any(stringprep.in_table_d1(c) for c in out):  # bidi: RandALCat only at both ends, no LCat
        if not (stringprep.in_table_d1(out[0]) and stringprep.in_table_d1(out[-1])) or \
                any(stringprep.in_table_d2(c) for c in out):
            raise AuthError("the password mixes right-to-left and left-to-right text (SASLprep)")
    return out


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def client_key(salted: bytes) -> bytes:
    return _hmac(salted, b"Client Key")


def server_key(salted: bytes) -> bytes:
    return _hmac(salted, b"Server Key")


def stored_key(client_key_: bytes) -> bytes:
    return hashlib.sha256(client_key_).digest()


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a node keeps of a password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def make_credentials(password: str, *, salt: bytes | None = None,
                     iterations: int = DEFAULT_ITERATIONS) -> Credentials:
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = salted_password(password, salt, iterations)
    return Credentials(salt, iterations, stored_key(client_key(salted)), server_key(salted))


def check_password(password: str, creds: Credentials) -> bool:
    """Whether ``password`` yields these credentials (slow: one PBKDF2)."""
    try:
        salted = salted_password(password, creds.salt, creds.iterations)
    except AuthError:
        return False
    return hmac.compare_digest(stored_key(client_key(salted)), creds.stored_key)


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str, what: str) -> bytes:
    try:
        return base64.b64decode(s.encode(), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise AuthError(f"SCRAM: {what} is not base64") from None


def _saslname(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def _unsaslname(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise AuthError("SCRAM: bad user name encoding")
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(msg: str, expect: str, what: str) -> dict[str, str]:
    """``a=v,b=w`` -> {a: v, b: w}; the keys must start with ``expect`` in that order."""
    parts = msg.split(",")
    out: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if len(key) != 1 or not eq:
            raise AuthError(f"SCRAM: malformed {what}")
        out.setdefault(key, value)
    if "".join(k for k in out)[:len(expect)] != expect:
        raise AuthError(f"SCRAM: malformed {what} (expected attributes {','.join(expect)})")
    return out


def _nonce() -> str:
    return base64.b64encode(secrets.token_bytes(18)).decode()  # printable, no ","


# -- the client's side -----------------------------------------------------------------------


class _SaltedCache:
    """SaltedPassword per (user, salt, iterations), remembered so reconnects cost no PBKDF2.

    Each entry keeps a keyed hash of the password it was computed from (under a key of this
    process), so another password for the same user misses.  Bounded (LRU)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._key = secrets.token_bytes(32)
        self._entries: OrderedDict[tuple[str, bytes, int], tuple[bytes, bytes]] = OrderedDict()
        self._lock = threading.Lock()  # the blocking client and the async one may share it

    def _tag(self, password: str) -> bytes:
        return _hmac(self._key, password.encode("utf-8", "surrogatepass"))

    def get(self, user: str, password: str, salt: bytes, iterations: int) -> bytes | None:
        with self._lock:
            hit = self._entries.get((user, salt, iterations))
            if hit is None or not hmac.compare_digest(hit[0], self._tag(password)):
                return None
            self._entries.move_to_end((user, salt, iterations))
            return hit[1]

    def put(self, user: str, password: str, salt: bytes, iterations: int, salted: bytes) -> None:
        with self._lock:
            self._entries[(user, salt, iterations)] = (self._tag(password), salted)
            self._entries.move_to_end((user, salt, iterations))
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


SALTED_CACHE = _SaltedCache()


class ScramClient:
    """One client exchange.  ``first`` -> send; ``challenge(server_first)`` tells what to
    salt with; ``final(salted)`` -> send; ``verify(server_final)`` checks the node.

        sc = ScramClient(user, password)
        hello(..., auth=sc.first)
        salt, iterations = sc.challenge(server_first)
        salted = sc.cached() or salted_password(password, salt, iterations)   # (off the loop)
        response(sc.final(salted))
        sc.verify(welcome.auth)
    """

    def __init__(self, user: str, password: str, *, nonce: str | None = None) -> None:
        self.user, self._password = user, password
        self._nonce = nonce or _nonce()
        self._bare = f"n={_saslname(user)},r={self._nonce}"
        self.first = _GS2_HEADER + self._bare
        self._server_first: str | None = None
        self._full_nonce = ""
        self.salt, self.iterations = b"", 0
        self._server_signature: bytes | None = None
        self._salted: bytes | None = None

    def challenge(self, server_first: str) -> tuple[bytes, int]:
        attrs = _attributes(server_first, "rsi", "server-first-message")
        nonce = attrs["r"]
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise AuthError("SCRAM: the node's nonce does not extend ours")
        try:
            iterations = int(attrs["i"])
        except ValueError:
            raise AuthError("SCRAM: the iteration count is not a number") from None
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AuthError(f"SCRAM: the node asks for {iterations} iterations "
                            f"(this client accepts {MIN_ITERATIONS}..{MAX_ITERATIONS})")
        self.salt, self.iterations = _unb64(attrs["s"], "the salt"), iterations
        self._server_first, self._full_nonce = server_first, nonce
        return self.salt, self.iterations

    def cached(self) -> bytes | None:
        return SALTED_CACHE.get(self.user, self._password, self.salt, self.iterations)

    def salt_password(self) -> bytes:
        """SaltedPassword for the challenge: from the cache, else computed (slow) and cached."""
        salted = self.cached()
        if salted is None:
            salted = salted_password(self._password, self.salt, self.iterations)
        return salted

    def final(self, salted: bytes) -> str:
        if self._server_first is None:
            raise AuthError("SCRAM: no server-first-message yet")
        without_proof = f"c={_CHANNEL_BINDING},r={self._full_nonce}"
        auth_message = f"{self._bare},{self._server_first},{without_proof}".encode()
        ck = client_key(salted)
        proof = _xor(ck, _hmac(stored_key(ck), auth_message))
        self._server_signature = _hmac(server_key(salted), auth_message)
        self._salted = salted
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> None:
        """AuthError unless the node's signature proves it holds this user's credentials."""
        if self._server_signature is None or self._salted is None:
            raise AuthError("SCRAM: the node answered before the exchange was complete")
        if server_final.startswith("e="):
            raise AuthError(f"SCRAM: the node refused: {server_final[2:]}")
        attrs = _attributes(server_final, "v", "server-final-message") if server_final else {}
        got = _unb64(attrs.get("v", ""), "the server signature")
        if not hmac.compare_digest(got, self._server_signature):
            raise AuthError("the node could not prove it holds this user's credentials (bad SCRAM server "
                            "signature): it is not the node it claims to be, or the user was changed")
        SALTED_CACHE.put(self.user, self._password, self.salt, self.iterations, self._salted)


# -- the node's side ------------------------------------------------------------------------


def parse_client_first(client_first: str) -> tuple[str, str]:
    """(user, client nonce) of a client-first-message; AuthError if malformed or if it asks
    for channel binding (not offered)."""
    if not client_first.startswith(_GS2_HEADER):
        if client_first[:2] in ("y,", "p="):
            raise AuthError("SCRAM: channel binding is not supported")
        raise AuthError("SCRAM: malformed client-first-message (expected the gs2 header 'n,,')")
    attrs = _attributes(client_first[len(_GS2_HEADER):], "nr", "client-first-message")
    if "m" in attrs:
        raise AuthError("SCRAM: mandatory extensions are not supported")
    if not attrs["r"] or not attrs["r"].isprintable() or "," in attrs["r"]:
        raise AuthError("SCRAM: bad client nonce")
    return _unsaslname(attrs["n"]), attrs["r"]


class ScramServer:
    """One node exchange for credentials ``creds``.

        user, _ = parse_client_first(hello.auth)
        ss = ScramServer(hello.auth, creds)
        send(AuthChallenge(data=ss.server_first))
        server_final = ss.final(response.data)   # AuthError if the proof is wrong
    """

    def __init__(self, client_first: str, creds: Credentials, *, nonce: str | None = None) -> None:
        _user, client_nonce = parse_client_first(client_first)
        self._creds = creds
        self._bare = client_first[len(_GS2_HEADER):]
        self._nonce = client_nonce + (nonce or _nonce())
        self.server_first = f"r={self._nonce},s={_b64(creds.salt)},i={creds.iterations}"

    def final(self, client_final: str) -> str:
        """The server-final-message if the client's proof holds; AuthError otherwise."""
        attrs = _attributes(client_final, "cr", "client-final-message")
        if "p" not in attrs or not client_final.endswith(",p=" + attrs["p"]):
            raise AuthError("SCRAM: malformed client-final-message (no proof)")
        if attrs["c"] != _CHANNEL_BINDING:
            raise AuthError("SCRAM: channel binding does not match the gs2 header")
        if attrs["r"] != self._nonce:
            raise AuthError("SCRAM: the nonce does not match")
        without_proof = client_final[: -len(",p=" + attrs["p"])]
        auth_message = f"{self._bare},{self.server_first},{without_proof}".encode()
        proof = _unb64(attrs["p"], "the client proof")
        creds = self._creds
        if len(proof) != len(creds.stored_key):
            raise AuthError("SCRAM: the proof has the wrong length")
        ck = _xor(proof, _hmac(creds.stored_key, auth_message))
        if not hmac.compare_digest(stored_key(ck), creds.stored_key):
            raise AuthError("wrong user name or password")
        return f"v={_b64(_hmac(creds.server_key, auth_message))}"
