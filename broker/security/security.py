"""Users and their grants as the group's state: created on any member, applied by all.

They travel like the queue catalogue (:mod:`broker.messaging.catalogue`).  On a single node a change
is one store commit; in shared mode, a write to the group's one database (passives read
the users and grants from it, ``Node.passive_users``).  In a replication group a change is
an entry of the catalogue's replicated log: a member forwards it to the catalogue's active
(``UserPutFwd`` and friends), which checks it against the group's state and proposes it,
and every member applies it once committed (:meth:`Security.apply`), so the change is
visible on every member, survives the loss of the active and a restart (the stores have
it, and the log brings a member that was away up to date).

Passwords are hashed on the member they were given to; only the salted hash travels.

The first admin: every node creates ``admin`` in its own store when the store has no
users (``broker.security.users.bootstrap_admin``), so a fresh node can be reached at once.  In a
group those records differ (their salts, and their passwords unless
``TANDEM_ADMIN_PASSWORD`` gave one to all), so the first catalogue active *seeds* the
group: it proposes its own ``admin`` record (:class:`~storage.base.SeedAdmin`), which every
member applies once, replacing its local one, and remembers (``meta.users = group``).
From then on the group has one user set; later seeds are no-ops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import msgpack

from broker.security.acl import AclTable, validate_grant
from broker.messaging.commit import CATALOGUE
from broker.logsafe import escape
from broker.messaging.forward import (MAX_HOPS, AclGrantFwd, AclRevokeFwd, Forwarding, ForwardRequest, UserDropFwd,
                            UserPutFwd, decode_reply, pack_reply)
from broker.security.users import UserRegistry
from client.errors import InvalidArgumentError, NotActiveError, TandemError, UnavailableError
from storage.base import (AclRecord, DropUser, GrantAcl, PutMeta, PutUser, RevokeAcl, SeedAdmin, UserRecord,
                          WriteOp, user_fields, user_from_fields)

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key: "group" once this member applied the group's first admin
SEEDED_KEY = "users"
SECURITY_OPS = (PutUser, DropUser, GrantAcl, RevokeAcl, SeedAdmin)
PUT_MODES = ("create", "password", "put")


class CatalogueHost(Forwarding, Protocol):
    """A node that changes the group's state through the catalogue (:func:`catalogue_change`)."""

    def refusal(self) -> NotActiveError | None: ...

    def catalogue_commit(self) -> int: ...

    def catalogue_applied(self) -> int: ...

    async def applied(self, what: str, done: Callable[[], bool]) -> None: ...


class Accounts(Protocol):
    """The users and grants a node holds, and what it does when one of them changes."""

    users: UserRegistry
    acls: AclTable

    def user_changed(self, name: str, *, seeded: bool = False) -> None:
        """A user, its password, role or grants changed here: end the sessions that no longer
        stand (broker.security.standing), or, for the group's first admin replacing the local one
        (``seeded``), keep them on the group's record."""
        ...


class Security:
    def __init__(self, catalogue: CatalogueHost, accounts: Accounts,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self.catalogue = catalogue
        self.accounts = accounts
        self.spawn = spawn  # runs the seed as a task of the node's
        self.seeded = False  # the group's first admin is applied here (replicated mode)
        #: the local admin record the seed replaced: a login proved with it is as good as one
        #: proved with the group's (broker.security.standing keeps such sessions)
        self.replaced_by_seed: UserRecord | None = None
        self._seeding = False

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: WriteOp) -> list[WriteOp]:
        """Apply a committed change here, and recheck the sessions of the user it is about;
        the ops to store."""
        stored = self._apply(op)
        if stored:
            self.accounts.user_changed(_subject(op), seeded=isinstance(op, SeedAdmin))
        return stored

    def _apply(self, op: WriteOp) -> list[WriteOp]:
        acc = self.accounts
        if isinstance(op, PutUser):
            acc.users.put(op.user)
            log.info("user %s (%s) stored", escape(op.user.name), op.user.role)
        elif isinstance(op, DropUser):
            acc.users.drop(op.name)
            acc.acls.drop_user(op.name)
            log.info("user %s deleted", escape(op.name))
        elif isinstance(op, GrantAcl):
            acc.acls.grant(op.acl)
            log.info("granted user=%s pattern=%s permissions=%s", escape(op.acl.user), escape(op.acl.pattern),
                     ",".join(op.acl.permissions))
        elif isinstance(op, RevokeAcl):
            acc.acls.revoke(op.acl)
            log.info("revoked user=%s pattern=%s permissions=%s", escape(op.acl.user), escape(op.acl.pattern),
                     ",".join(op.acl.permissions))
        elif isinstance(op, SeedAdmin):
            if self.seeded:
                return []
            self.seeded = True
            self.replaced_by_seed = acc.users.get(op.user.name)
            acc.users.put(op.user)
            log.warning("user admin: the group's first admin is the one created on %s (its password is the one "
                        "that node was started with)", op.origin)
            return [PutUser(op.user), PutMeta(SEEDED_KEY, "group")]
        else:
            raise TypeError(f"{type(op).__name__} is not a change of the users")
        return [op]

    def current(self, proved: UserRecord) -> bool:
        """Whether a login proved with record ``proved`` stands for the user as it is now:
        nothing changed it meanwhile, or only the group's first admin replaced it."""
        now = self.accounts.users.get(proved.name)
        return now == proved or (now is not None and proved == self.replaced_by_seed)

    def snapshot(self) -> dict[str, Any]:
        """The users, grants and seed mark, for the catalogue's snapshot."""
        acc = self.accounts
        users = [acc.users.get(n) for n in acc.users.names()]
        return {"users": [user_fields(u) for u in users if u is not None],
                "acls": [[a.user, a.pattern, list(a.permissions)] for a in acc.acls.records()],
                "seeded": self.seeded}

    def install(self, data: dict[str, Any]) -> list[WriteOp]:
        """Replace the users and grants with a snapshot's; the ops to store."""
        acc = self.accounts
        users = [user_from_fields(u) for u in data.get("users", [])]
        acls = [AclRecord(user=a[0], pattern=a[1], permissions=tuple(a[2])) for a in data.get("acls", [])]
        keep = {u.name for u in users}
        if data.get("seeded") and not self.seeded:
            self.replaced_by_seed = acc.users.get("admin")
        ops: list[WriteOp] = [DropUser(n) for n in acc.users.names() if n not in keep]
        ops += [RevokeAcl(a) for a in acc.acls.records()]
        ops += [PutUser(u) for u in users] + [GrantAcl(a) for a in acls]
        for op in ops:
            self._apply(op)  # (the sessions are rechecked once the whole state is in place)
        seeded = bool(data.get("seeded")) and not self.seeded
        if seeded:
            self.seeded = True
            ops.append(PutMeta(SEEDED_KEY, "group"))
        for name in sorted({_subject(op) for op in ops if not isinstance(op, PutMeta)}):
            acc.user_changed(name, seeded=seeded and name == "admin")
        return ops

    def maybe_seed(self) -> None:
        """The catalogue's active seeds the group's first admin, once (see the module doc)."""
        if self.seeded or self._seeding:
            return
        try:
            commit = self.catalogue.commit
        except TandemError:  # not started, or stopping
            return
        if not commit.catalogue_log:  # (one store: one admin already)
            return
        if commit.active_of(CATALOGUE) != self.catalogue.config.name or not commit.serving(CATALOGUE):
            return
        admin = self.accounts.users.get("admin")
        if admin is None:
            return
        self._seeding = True
        self.spawn(self._seed(admin))

    async def _seed(self, admin: UserRecord) -> None:
        try:
            await self._commit(SeedAdmin(admin, self.catalogue.config.name))
        except TandemError as exc:
            log.info("seeding the group's first admin failed (the next catalogue active tries): %s", exc.message)
        finally:
            self._seeding = False

    # -- changes asked for on this member -----------------------------------------------------------

    async def put_user(self, user: UserRecord, mode: str, hops: int = 0) -> None:
        """``create`` a user, change its ``password`` (keeping its role), or ``put`` it."""
        if mode not in PUT_MODES:
            raise InvalidArgumentError(f"unknown user change {mode!r}")

        def check() -> WriteOp:
            have = self.accounts.users.get(user.name)
            if mode == "create" and have is not None:
                raise InvalidArgumentError(f"user {user.name!r} exists (change its password with passwd)")
            if mode == "password":
                if have is None:
                    raise InvalidArgumentError(f"no user {user.name!r}")
                return PutUser(dataclasses.replace(user, role=have.role))
            return PutUser(user)

        fwd = UserPutFwd(hops + 1, msgpack.packb(user_fields(user), use_bin_type=True), mode)
        await self._change(f"user {user.name!r}", check, fwd, hops)
        log.warning("user %s: %s (role %s)", escape(user.name), {"create": "created", "password": "password changed",
                                                         "put": "stored"}[mode], user.role)

    async def drop_user(self, name: str, hops: int = 0) -> None:
        def check() -> WriteOp:
            if self.accounts.users.get(name) is None:
                raise InvalidArgumentError(f"no user {name!r}")
            return DropUser(name)

        await self._change(f"user {name!r}", check, UserDropFwd(hops + 1, name), hops)

    async def grant(self, acl: AclRecord, hops: int = 0) -> None:
        acl = validate_grant(acl.user, acl.pattern, acl.permissions)

        def check() -> WriteOp:
            self._known(acl.user)
            return GrantAcl(acl)

        await self._change(f"grant to {acl.user!r}", check,
                           AclGrantFwd(hops + 1, acl.user, acl.pattern, ",".join(acl.permissions)), hops)

    async def revoke(self, acl: AclRecord, hops: int = 0) -> None:
        acl = validate_grant(acl.user, acl.pattern, acl.permissions)

        def check() -> WriteOp:
            self._known(acl.user)
            return RevokeAcl(acl)

        await self._change(f"grant of {acl.user!r}", check,
                           AclRevokeFwd(hops + 1, acl.user, acl.pattern, ",".join(acl.permissions)), hops)

    def _known(self, name: str) -> None:
        if self.accounts.users.get(name) is None:
            raise InvalidArgumentError(f"no user {name!r}")

    async def _change(self, what: str, check: Callable[[], WriteOp], fwd: ForwardRequest, hops: int) -> int:
        return await catalogue_change(self.catalogue, what, check, fwd, hops, local=self.apply)

    async def _commit(self, op: WriteOp) -> None:
        await commit_catalogue(self.catalogue, op)

    # -- forwarded here (this node is the catalogue's active) ---------------------------------------

    async def forwarded(self, req: ForwardRequest) -> bytes:
        if isinstance(req, UserPutFwd):
            try:
                data = msgpack.unpackb(req.user, raw=False)
            except Exception as exc:  # msgpack raises several types
                raise InvalidArgumentError(f"forwarded user: not msgpack ({exc})") from None
            await self.put_user(user_from_fields(data), req.mode, max(1, req.hops))
        elif isinstance(req, UserDropFwd):
            await self.drop_user(req.name, max(1, req.hops))
        elif isinstance(req, AclGrantFwd):
            await self.grant(validate_grant(req.user, req.pattern, req.permissions), max(1, req.hops))
        elif isinstance(req, AclRevokeFwd):
            await self.revoke(validate_grant(req.user, req.pattern, req.permissions), max(1, req.hops))
        else:
            raise InvalidArgumentError(f"{type(req).__name__} is not a change of the users")
        return pack_reply(self.catalogue.catalogue_commit())


def _subject(op: WriteOp) -> str:
    """The user a change of the users and grants is about."""
    if isinstance(op, (PutUser, SeedAdmin)):
        return op.user.name
    if isinstance(op, DropUser):
        return op.name
    if isinstance(op, (GrantAcl, RevokeAcl)):
        return op.acl.user
    raise TypeError(f"{type(op).__name__} is not a change of the users")


async def catalogue_change(node: CatalogueHost, what: str, check: Callable[[], WriteOp | list[WriteOp]],
                           fwd: ForwardRequest, hops: int, *, local: Callable[[WriteOp], object]) -> int:
    """Check and commit a change of the group's state where that state is decided (this
    node, or the catalogue's active, which ``fwd`` goes to), and return once it is applied
    here.  Returns the catalogue's commit index with it where the catalogue is a log every
    member applies (``CommitPath.catalogue_log``); 0 otherwise, where ``local`` applies the
    change after its commit."""
    refusal = node.refusal()
    if refusal is not None:
        raise refusal
    commit = node.commit
    if not commit.catalogue_log:
        made = check()
        ops = made if isinstance(made, list) else [made]
        await commit_catalogue(node, ops)
        for op in ops:
            local(op)
        return 0
    who = await commit.wait_active(CATALOGUE, node.election_wait)
    if who != node.config.name:
        if hops >= MAX_HOPS:
            raise UnavailableError(f"{what}: forwarded too many times while the group elects: retry")
        upto = int(decode_reply(await node.forward(who, fwd)))
    else:
        await commit_catalogue(node, check())
        upto = node.catalogue_commit()
    await node.applied(what, lambda: node.catalogue_applied() >= upto)
    return upto


async def commit_catalogue(node: CatalogueHost, op: WriteOp | list[WriteOp]) -> None:
    """Propose ``op`` (or ops, one entry) to the catalogue (this node is its active); return
    once committed."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(err: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(err) if err is not None else fut.set_result(None)

    node.commit.propose_catalogue(op if isinstance(op, list) else [op], done)
    await fut
