"""SCRAM-SHA-256 math and messages (client.scram), the node's exchange and the failed-login
throttle (broker.security.auth): sans-IO cores, driven directly."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from broker.security.auth import ClientGuard, ClientHandshake, LoginThrottle
from broker.config import NodeConfig
from broker.security.secret import DECOY_LABEL, decoy_key
from broker.security.users import UserRegistry, credentials, make_user
from client import scram
from client.errors import (AuthError, InvalidArgumentError, LoginThrottledError, PrefetchTooLargeError,
                           TooManyConnectionsError)
from client.protocol.frames import AuthResponse, Hello
from client.testing import FakeClock
from storage.base import UserRecord

# RFC 7677, section 3: user "user", password "pencil"
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")


def test_client_side_matches_rfc7677() -> None:
    sc = scram.ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert sc.first == RFC_CLIENT_FIRST
    assert sc.challenge(RFC_SERVER_FIRST) == (RFC_SALT, 4096)
    assert sc.final(scram.salted_password("pencil", RFC_SALT, 4096)) == RFC_CLIENT_FINAL
    sc.verify(RFC_SERVER_FINAL)


def test_server_side_matches_rfc7677() -> None:
    creds = scram.make_credentials("pencil", salt=RFC_SALT, iterations=4096)
    ss = scram.ScramServer(RFC_CLIENT_FIRST, creds, nonce=RFC_SERVER_NONCE)
    assert ss.server_first == RFC_SERVER_FIRST
    assert ss.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL


def test_a_wrong_password_fails_the_proof() -> None:
    creds = scram.make_credentials("pencil", salt=RFC_SALT, iterations=4096)
    sc = scram.ScramClient("user", "pencil2")
    ss = scram.ScramServer(sc.first, creds)
    sc.challenge(ss.server_first)
    with pytest.raises(AuthError, match="wrong user name or password"):
        ss.final(sc.final(sc.salt_password()))


def test_the_client_refuses_a_node_without_the_credentials() -> None:
    """A node that does not hold the user's ServerKey cannot sign: the client says so."""
    sc = scram.ScramClient("user", "pencil")
    fake = scram.ScramServer(sc.first, scram.make_credentials("guessed-password", iterations=4096))
    sc.challenge(fake.server_first)
    client_final = sc.final(sc.salt_password())
    forged = "v=" + base64.b64encode(b"\0" * 32).decode()
    with pytest.raises(AuthError, match="could not prove"):
        sc.verify(forged)
    with pytest.raises(AuthError):
        sc.verify("")
    assert client_final.count(",p=") == 1


def test_the_client_refuses_a_nonce_it_did_not_start_and_absurd_iterations() -> None:
    sc = scram.ScramClient("user", "pencil", nonce="abc")
    with pytest.raises(AuthError, match="nonce"):
        sc.challenge("r=xyz123,s=c2FsdA==,i=4096")
    with pytest.raises(AuthError, match="nonce"):
        sc.challenge("r=abc,s=c2FsdA==,i=4096")  # not extended
    with pytest.raises(AuthError, match="iterations"):
        sc.challenge("r=abcd,s=c2FsdA==,i=100")
    with pytest.raises(AuthError, match="iterations"):
        sc.challenge(f"r=abcd,s=c2FsdA==,i={scram.MAX_ITERATIONS + 1}")
    with pytest.raises(AuthError, match="malformed"):
        sc.challenge("garbage")


@pytest.mark.parametrize("client_first", ["", "y,,n=u,r=x", "p=tls-unique,,n=u,r=x", "n,,r=x", "n,,n=u",
                                          "n,,n=u,r=", "n,,n=a=b,r=x", "n,,m=ext,n=u,r=x"])
def test_the_node_refuses_malformed_client_first_messages(client_first: str) -> None:
    with pytest.raises(AuthError):
        scram.parse_client_first(client_first)


def test_user_names_with_commas_and_equals_signs_survive() -> None:
    sc = scram.ScramClient("a,b=c", "password")
    assert scram.parse_client_first(sc.first)[0] == "a,b=c"


def test_the_node_refuses_a_replayed_or_altered_final_message() -> None:
    creds = scram.make_credentials("pencil", iterations=4096)
    sc = scram.ScramClient("user", "pencil")
    ss = scram.ScramServer(sc.first, creds)
    sc.challenge(ss.server_first)
    final = sc.final(sc.salt_password())
    other = scram.ScramServer(sc.first, creds)  # a new exchange: another server nonce
    with pytest.raises(AuthError, match="nonce"):
        other.final(final)
    with pytest.raises(AuthError):
        ss.final(final.replace("c=biws", "c=eSws"))
    with pytest.raises(AuthError):
        ss.final(final.split(",p=")[0])
    assert ss.final(final).startswith("v=")


def test_saslprep_maps_spaces_and_refuses_control_characters() -> None:
    assert scram.saslprep("I\u00adX") == "IX"  # soft hyphen: mapped to nothing
    assert scram.saslprep("a\u00a0b") == "a b"  # non-ASCII space
    assert scram.saslprep("\u2168") == "IX"  # NFKC
    with pytest.raises(AuthError):
        scram.saslprep("a\u0007b")
    with pytest.raises(AuthError):
        scram.saslprep("\u0627\u0031")  # RandALCat not at both ends


def test_the_client_caches_salted_passwords_per_user_salt_and_iterations() -> None:
    scram.SALTED_CACHE.clear()
    creds = scram.make_credentials("pencil", iterations=4096)

    def exchange(password: str) -> scram.ScramClient:
        sc = scram.ScramClient("cached-user", password)
        ss = scram.ScramServer(sc.first, creds)
        sc.challenge(ss.server_first)
        final = sc.final(sc.salt_password())
        try:
            sc.verify(ss.final(final))
        except AuthError:
            pass
        return sc

    assert exchange("pencil").cached() is not None  # remembered after the node proved itself
    assert exchange("wrong-one").cached() is None  # another password misses
    assert exchange("pencil").cached() == scram.salted_password("pencil", creds.salt, 4096)


# -- the node's records and exchange ----------------------------------------------------------


def test_make_user_keeps_scram_keys_and_never_the_password() -> None:
    rec = make_user("alice", "alice-password", "admin", iterations=4096)
    assert rec.params == "scram-sha-256:i=4096" and len(rec.hash) == 64 and len(rec.salt) == 16
    creds = credentials(rec)
    assert creds is not None and scram.check_password("alice-password", creds)
    assert b"alice-password" not in rec.hash + rec.salt
    salted = scram.salted_password("alice-password", rec.salt, 4096)
    assert salted not in rec.hash  # SaltedPassword (password-equivalent) is not kept
    assert scram.client_key(salted) not in rec.hash  # nor ClientKey


def _guard(**kw: int) -> tuple[ClientGuard, FakeClock]:
    clock = FakeClock(1000.0)
    return ClientGuard(NodeConfig(**kw), clock), clock


def _hello(sc: scram.ScramClient, user: str) -> Hello:
    return Hello(min_version=1, max_version=1, client_name="t", user=user, mechanism=scram.MECHANISM,
                 auth=sc.first)


def _login(guard: ClientGuard, users: UserRegistry, user: str, password: str, addr: str = "10.0.0.1") -> UserRecord:
    hs = ClientHandshake(guard, users, addr)
    sc = scram.ScramClient(user, password)
    challenge = hs.hello(_hello(sc, user))
    sc.challenge(challenge.data)
    rec, server_final = hs.response(AuthResponse(data=sc.final(sc.salt_password())))
    sc.verify(server_final)
    return rec


def test_the_node_exchange_logs_in_and_refuses_wrong_passwords_and_unknown_users() -> None:
    guard, _clock = _guard(max_failed_logins=100)
    users = UserRegistry([make_user("alice", "alice-password", "monitor", iterations=4096)])
    assert _login(guard, users, "alice", "alice-password").name == "alice"
    with pytest.raises(AuthError, match="authentication failed for user 'alice'"):
        _login(guard, users, "alice", "not-her-password")
    with pytest.raises(AuthError, match="authentication failed for user 'bob': wrong user name or password"):
        _login(guard, users, "bob", "whatever-password")
    assert guard.counters.auth_failures == 2


def test_unknown_users_get_a_stable_decoy_challenge() -> None:
    users = UserRegistry([])
    (_u1, c1), (_u2, c2) = users.scram_credentials("ghost"), users.scram_credentials("ghost")
    assert c1 == c2 and c1.iterations == scram.DEFAULT_ITERATIONS
    assert users.scram_credentials("other")[1].salt != c1.salt


def test_registries_with_one_decoy_key_answer_an_unknown_name_alike() -> None:
    """Every member derives the decoy key from the group secret (broker.security.secret.decoy_key):
    the same key, the same challenge for a name nobody has, on each member and after a
    restart; another key, another salt."""
    group = decoy_key(b"the group's secret, 32 bytes...", Path("/nonexistent"))
    a, b = UserRegistry([], decoy_key=group), UserRegistry([make_user("bob", "bob-password", "user")],
                                                              decoy_key=group)
    assert a.scram_credentials("ghost") == b.scram_credentials("ghost")
    other = UserRegistry([], decoy_key=decoy_key(b"another group's secret, 32 bytes", Path("/nonexistent")))
    assert other.scram_credentials("ghost")[1].salt != a.scram_credentials("ghost")[1].salt


def test_a_decoy_looks_like_a_real_user_and_is_not_derivable_without_the_key() -> None:
    secret = b"the group's secret, 32 bytes..."
    key = decoy_key(secret, Path("/nonexistent"))
    assert key != secret and secret not in key and len(key) == 32
    _none, decoy = UserRegistry([], decoy_key=key).scram_credentials("ghost")
    real = credentials(make_user("bob", "bob-password", "user"))
    assert real is not None
    assert (len(decoy.salt), decoy.iterations) == (len(real.salt), real.iterations) == (16, scram.DEFAULT_ITERATIONS)
    assert len(decoy.stored_key) == len(decoy.server_key) == 32
    # what someone without the key could compute from the name (and the secret used directly, or no key) differs
    name = b"ghost"
    guesses = {hashlib.sha256(name).digest()[:16], hmac.new(b"", name, "sha256").digest()[:16],
               hmac.new(secret, name, "sha256").digest()[:16], hmac.new(DECOY_LABEL, name, "sha256").digest()[:16]}
    assert decoy.salt not in guesses
    assert UserRegistry([]).scram_credentials("ghost")[1].salt != decoy.salt  # a registry's own random key


@pytest.mark.parametrize("name", ["a\nb", "x\r", "\x1b[31mred", "tab\there", "a\u2028b", "nel\x85", "\x00"])
def test_user_names_with_control_characters_cannot_be_created(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="non-printable"):
        make_user(name, "a-password", "user", iterations=4096)


def test_user_names_of_any_script_can_be_created() -> None:
    assert make_user("élodie 山田.ops", "a-password", "user", iterations=4096).name == "élodie 山田.ops"


def test_a_hello_without_scram_is_refused_clearly() -> None:
    guard, _clock = _guard()
    hs = ClientHandshake(guard, UserRegistry([]), "10.0.0.1")
    with pytest.raises(AuthError, match="SCRAM-SHA-256 only"):
        hs.hello(Hello(min_version=1, max_version=1, client_name="old", user="admin"))


def test_users_in_the_scrypt_format_are_told_how_to_get_back_in() -> None:
    import hashlib

    salt = b"s" * 16
    legacy = UserRecord(name="old", salt=salt, role="admin", params="scrypt:n=16384,r=8,p=1",
                        hash=hashlib.scrypt(b"old-password", salt=salt, n=2**14, r=8, p=1, dklen=32,
                                            maxmem=64 * 1024 * 1024))
    users = UserRegistry([legacy])
    guard, _clock = _guard()
    with pytest.raises(AuthError, match="scrypt format.*POST /api/v1/users/old/password"):
        _login(guard, users, "old", "old-password")
    assert users.verify("old", "old-password") is legacy  # the console still checks it
    with pytest.raises(AuthError):
        users.verify("old", "wrong-password")


def test_failed_logins_from_an_address_back_off_exponentially_and_a_success_resets() -> None:
    guard, clock = _guard(max_failed_logins=3)
    users = UserRegistry([make_user("alice", "alice-password", "admin", iterations=4096)])
    for _ in range(2):
        with pytest.raises(AuthError):
            _login(guard, users, "alice", "wrong-password")
    assert guard.throttle.wait("10.0.0.1", clock.monotonic()) == 0  # below the limit: no wait
    waits = []
    for _ in range(7):
        with pytest.raises(AuthError):
            _login(guard, users, "alice", "wrong-password")
        waits.append(guard.throttle.wait("10.0.0.1", clock.monotonic()))
        with pytest.raises(LoginThrottledError, match=r"too many failed logins from 10.0.0.1: try again in"):
            _login(guard, users, "alice", "alice-password")  # even the right password waits
        clock.advance(waits[-1])
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert _login(guard, users, "alice", "alice-password", addr="10.0.0.2").name == "alice"  # others are not slowed
    assert _login(guard, users, "alice", "alice-password").name == "alice"  # after the wait
    with pytest.raises(AuthError):
        _login(guard, users, "alice", "wrong-password")
    assert guard.throttle.wait("10.0.0.1", clock.monotonic()) == 0  # the success started the count again
    assert guard.counters.logins_throttled == 7 and guard.counters.auth_failures == 10


def test_failures_far_apart_do_not_add_up() -> None:
    t = LoginThrottle(2, window=300.0)
    assert t.failed("a", 0.0) == 0.0
    assert t.failed("a", 301.0) == 0.0  # the first is forgotten
    assert t.failed("a", 302.0) == 1.0


def test_the_throttle_table_is_bounded() -> None:
    t = LoginThrottle(1, max_tracked=100)
    for i in range(10_000):
        t.failed(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", float(i) / 1000)
    assert len(t) == 100
    assert t.wait("10.0.39.15", 10.0) > 0  # the most recent are kept


def test_connections_per_user_and_prefetch_limits() -> None:
    guard, _clock = _guard(max_connections_per_user=2, max_prefetch=500)
    guard.admit("alice")
    guard.admit("alice")
    with pytest.raises(TooManyConnectionsError, match="max_connections_per_user = 2"):
        guard.admit("alice")
    guard.admit("bob")
    guard.release("alice")
    guard.admit("alice")
    guard.check_prefetch(500)
    with pytest.raises(PrefetchTooLargeError, match="max_prefetch = 500"):
        guard.check_prefetch(501)
    assert guard.counters.connections_refused == 1 and guard.counters.prefetch_refused == 1
