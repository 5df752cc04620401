"""A client session's requests on the group's users and grants (broker.security.security).

Writing users and grants needs the ``admin`` permission; a user may list its own grants.  A
user that changes its own password keeps the session it does it on (its others end).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from broker.logsafe import escape
from broker.security.security import Security
from broker.security.standing import Standing, Standings
from broker.security.users import make_user
from broker.sessions.requests import Handler, Requester
from client.errors import InvalidArgumentError
from client.protocol.frames import AclGrant, AclInfo, AclList, AclRevoke, Acls, Frame, Ok, UserDelete, UserInfo, \
    UserList, UserPut, Users
from storage.base import AclRecord, UserRecord

log = logging.getLogger("tandem.broker")


class Account(Requester, Protocol):
    """A client session as the user requests see it: what its login rests on."""
    standing: Standing | None  # (broker.security.standing)

    def renew_standing(self) -> None:
        """Take the user's standing as it is now."""
        ...


class UserRequests:
    """The handlers of the requests on users and grants: ``node`` holds the group's users and
    grants as this member has them, ``security`` changes them in the group."""

    def __init__(self, node: Standings, security: Security) -> None:
        self.node, self.security = node, security

    def handlers(self) -> Mapping[type[Frame], Handler[Account]]:
        return {UserPut: self.user_put, UserDelete: self.user_delete, UserList: self.user_list,
                AclGrant: self.acl_grant, AclRevoke: self.acl_revoke, AclList: self.acl_list}

    def _group_admin(self, user: UserRecord, what: str) -> None:
        """A group operation: the user needs the ``admin`` permission (role admin or granted)."""
        self.node.acls.check_group(user, what)

    async def user_put(self, s: Account, user: UserRecord, f: UserPut) -> None:
        self._group_admin(user, "manage users")
        role = f.role
        if f.mode == "password":
            have = self.node.users.get(f.name)
            role = have.role if have is not None else "user"  # the catalogue's active keeps the role it has
        record = await asyncio.to_thread(make_user, f.name, f.password, role)  # scrypt: off the loop
        mine = s.standing is not None and f.name == s.standing.name and f.mode == "password"
        if mine:  # a user changing its own password keeps this session (its others end)
            s.standing = None
        try:
            await self.security.put_user(record, f.mode)
        finally:
            if mine:
                s.renew_standing()
        log.warning("session %s: user %s %s", s.client_name, escape(f.name),
                    "password changed" if f.mode == "password" else f"stored (role {role})")
        s.send(Ok(rid=f.rid))

    async def user_delete(self, s: Account, user: UserRecord, f: UserDelete) -> None:
        self._group_admin(user, "manage users")
        if f.name == user.name:
            raise InvalidArgumentError("you cannot delete the user you are logged in as")
        await self.security.drop_user(f.name)
        log.warning("session %s: user %s deleted", s.client_name, escape(f.name))
        s.send(Ok(rid=f.rid))

    async def user_list(self, s: Account, user: UserRecord, f: UserList) -> None:
        self._group_admin(user, "list users")
        users = self.node.users
        s.send(Users(rid=f.rid, users=[UserInfo(n, u.role) for n in users.names()
                                       if (u := users.get(n)) is not None]))

    async def acl_grant(self, s: Account, user: UserRecord, f: AclGrant) -> None:
        self._group_admin(user, "grant permissions")
        await self.security.grant(AclRecord(user=f.user, pattern=f.pattern, permissions=tuple(f.permissions)))
        log.warning("session %s: granted %s on %s to %s", s.client_name, ",".join(f.permissions),
                    escape(f.pattern), escape(f.user))
        s.send(Ok(rid=f.rid))

    async def acl_revoke(self, s: Account, user: UserRecord, f: AclRevoke) -> None:
        self._group_admin(user, "revoke permissions")
        await self.security.revoke(AclRecord(user=f.user, pattern=f.pattern, permissions=tuple(f.permissions)))
        log.warning("session %s: revoked %s on %s from %s", s.client_name, ",".join(f.permissions),
                    escape(f.pattern), escape(f.user))
        s.send(Ok(rid=f.rid))

    async def acl_list(self, s: Account, user: UserRecord, f: AclList) -> None:
        if f.user != user.name:  # a user may see its own grants; everyone's take the admin permission
            self._group_admin(user, "list the grants of other users")
        records = self.node.acls.records(f.user)
        s.send(Acls(rid=f.rid, acls=[AclInfo(a.user, a.pattern, list(a.permissions)) for a in records]))
