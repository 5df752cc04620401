"""The group secret on disk: ``cluster_secret_file`` read at start-up, and ``tandem secret new``.

The file holds text (``tandem secret new`` writes 64 hex digits and a newline); the key is
that text with surrounding whitespace stripped, so any editor or ``openssl rand -hex 32``
makes a valid one.  Every member of a group reads the same file (a copy of it) and proves
it on each peer link (:mod:`ha.peerauth`).

And the *decoy key* (:func:`decoy_key`): what the SCRAM challenge of a user name nobody has
is derived from (:meth:`broker.security.users.UserRegistry.scram_credentials`).  A real user's salt is
the group's, the same on every member and after every restart; so must a made-up name's be,
or asking two members (or one, twice across a restart) would tell which names exist.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from broker.config import ConfigError, NodeConfig
from ha.peerauth import parse_secret

log = logging.getLogger("tandem.ha")

#: bytes of randomness in a secret ``tandem secret new`` makes (written as hex)
SECRET_BYTES = 32
#: the file in a node's data dir holding its own decoy key (a node with no group secret)
DECOY_KEY_FILE = "decoy-key"
DECOY_KEY_BYTES = 32
#: the domain of the decoy key derived from the group secret: no other HMAC under the secret is
#: made over these bytes (a peer proof's message starts with a length prefix, ha.peerauth)
DECOY_LABEL = b"tandem scram decoy key v1"


def is_group_member(cfg: NodeConfig) -> bool:
    """Whether ``cfg`` makes its node a member of a replication group: it has peers (or a witness)."""
    return bool(cfg.peers) or cfg.witness_address() is not None


def peer_mtls(cfg: NodeConfig) -> bool:
    """Whether the node's peer links use mutual TLS (its certificate, and a CA for the peers')."""
    return cfg.peer_tls_on and cfg.tls_ca is not None


def group_secret(cfg: NodeConfig) -> bytes | None:
    """The key of ``cfg.cluster_secret_file``; None when none is set and none is needed (not a
    group member, or peer links under mutual TLS).  ConfigError, naming the file and the
    remedy, when it cannot be read or a group member has none."""
    if cfg.cluster_secret_file is not None:
        return load_secret(cfg.cluster_secret_file)
    if is_group_member(cfg) and not peer_mtls(cfg):
        raise ConfigError(
            f"node {cfg.name} is a member of a replication group and has no group secret: anyone who reaches "
            f"its peer port could join as a member. Make one with `tandem secret new PATH`, copy it to every "
            f"member and the witness, and start each with --cluster-secret-file PATH (cluster_secret_file in "
            f"TOML); or give the peer links mutual TLS (tls_cert, tls_key and tls_ca)")
    return None


def load_secret(path: Path) -> bytes:
    """The key in ``path``; ConfigError when the file is missing, unreadable, empty or too short.
    Logs a warning when other users may read it."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"cluster_secret_file {path}: not a regular file")
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"cluster_secret_file {path}: no such file (make one with `tandem secret new {path}`)") \
            from None
    except OSError as exc:
        raise ConfigError(f"cluster_secret_file {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        key = parse_secret(text)
    except ValueError as exc:
        raise ConfigError(f"cluster_secret_file {path}: {exc} (make one with `tandem secret new {path} --force`)") \
            from None
    if st.st_mode & 0o077:
        log.warning("cluster_secret_file %s is readable by other users (mode %o): chmod 600 %s", path,
                    stat.S_IMODE(st.st_mode), path)
    return key


def new_secret(path: Path, *, force: bool = False) -> None:
    """Write a fresh random secret to ``path`` (mode 0600); ConfigError if the file exists and
    ``force`` is not set."""
    text = (secrets.token_hex(SECRET_BYTES) + "\n").encode()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists already: it may be the secret a running group uses. Use --force to "
                          f"replace it (then every member needs the new file)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create it: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)  # an existing file replaced with --force keeps no wider mode
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_secret(path: Path) -> Path:
    """``path``, holding a secret: made now unless it exists (``tandem cluster up``, LocalCluster:
    the group keeps its secret across runs)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            new_secret(path)
        except ConfigError:
            if not path.exists():  # not a race with another maker: a real failure
                raise
    return path


def decoy_key(secret: bytes | None, data_dir: Path) -> bytes:
    """The key unknown user names' SCRAM salts and keys are derived from.

    With a group secret: ``HMAC-SHA256(secret, DECOY_LABEL)``, the same on every member that
    holds the secret, across restarts; it tells nothing of the secret (HMAC is one-way, and
    nothing else is ever computed under the secret over those bytes).  Without one (a single
    node, or a group whose peer links use mutual TLS alone): a random key of this node's own,
    made once in ``<data_dir>/decoy-key`` (mode 0600) and read at every start.  ConfigError,
    naming the file, when it cannot be read or made, or does not hold a key."""
    if secret is not None:
        return hmac.new(secret, DECOY_LABEL, "sha256").digest()
    path = data_dir / DECOY_KEY_FILE
    remedy = "remove it: the node makes a new one when it starts"
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = _new_decoy_key(path)
    except OSError as exc:
        raise ConfigError(f"decoy key {path}: cannot read it: {exc.strerror or exc} (the node's user must read "
                          f"it; or {remedy})") from None
    if len(key) != DECOY_KEY_BYTES:
        raise ConfigError(f"decoy key {path}: it holds {len(key)} bytes, not {DECOY_KEY_BYTES} ({remedy})")
    return key


def _new_decoy_key(path: Path) -> bytes:
    """A random key, written to ``path`` whole or not at all (a temporary file, synced, then
    renamed over: one node owns a data dir, so nothing else makes this file meanwhile)."""
    key = secrets.token_bytes(DECOY_KEY_BYTES)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise ConfigError(f"decoy key {path}: cannot make it: {exc.strerror or exc}") from None
    return key
