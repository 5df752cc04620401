"""broker.security.security: what a member does with a committed change of the users and grants, and
with the catalogue snapshot that replaces them (what goes to its store, what it keeps)."""

from __future__ import annotations

from typing import Any

from broker.security.acl import AclTable, validate_grant
from broker.security.security import SEEDED_KEY, Security
from broker.security.users import UserRegistry
from storage.base import DropUser, GrantAcl, PutMeta, PutUser, RevokeAcl, SeedAdmin, UserRecord, WriteOp


def user(name: str, role: str = "user", salt: bytes = b"s") -> UserRecord:
    return UserRecord(name=name, salt=salt, hash=b"h", role=role, params="p")


class Member:
    """The state a member keeps (Security reads and writes these; nothing else is used here)."""

    def __init__(self) -> None:
        self.users = UserRegistry([])
        self.acls = AclTable()
        self.changed: list[str] = []

    def user_changed(self, name: str, *, seeded: bool = False) -> None:
        self.changed.append(f"{name} (seeded)" if seeded else name)


def security() -> tuple[Security, Member]:
    m = Member()
    return Security(None, m, None), m  # type: ignore[arg-type]  # only the state above is used


def test_committed_changes_are_applied_and_stored_as_they_are() -> None:
    sec, m = security()
    grant = validate_grant("bob", "orders.*", "consume,browse")
    for op in (PutUser(user("bob")), GrantAcl(grant)):
        assert sec.apply(op) == [op]
    assert m.users.get("bob") == user("bob") and m.acls.records() == [grant]
    revoke = RevokeAcl(validate_grant("bob", "orders.*", "browse"))
    assert sec.apply(revoke) == [revoke]
    assert m.acls.records()[0].permissions == ("consume",)
    assert sec.apply(DropUser("bob")) == [DropUser("bob")]
    assert m.users.get("bob") is None and m.acls.records() == []
    assert m.changed == ["bob"] * 4  # each change rechecks the user's sessions


def test_the_first_admin_is_seeded_once() -> None:
    sec, m = security()
    m.users.put(user("admin", "admin", salt=b"mine"))
    group_admin = user("admin", "admin", salt=b"node1's")
    assert sec.apply(SeedAdmin(group_admin, "node1")) == [PutUser(group_admin), PutMeta(SEEDED_KEY, "group")]
    assert m.changed == ["admin (seeded)"]  # its sessions go on with the group's admin
    assert m.users.get("admin") == group_admin and sec.seeded
    later = user("admin", "admin", salt=b"node2's")
    assert sec.apply(SeedAdmin(later, "node2")) == []  # a later active's seed changes nothing
    assert m.changed == ["admin (seeded)"]
    assert m.users.get("admin") == group_admin


def test_a_snapshot_replaces_the_users_and_grants() -> None:
    src, sm = security()
    first: list[WriteOp] = [PutUser(user("admin", "admin")), PutUser(user("bob")),
                            GrantAcl(validate_grant("bob", "o.*", "consume")), SeedAdmin(user("admin", "admin"), "node1")]
    for op in first:
        src.apply(op)
    snap: dict[str, Any] = src.snapshot()
    dst, dm = security()
    theirs: list[WriteOp] = [PutUser(user("carol")), GrantAcl(validate_grant("carol", "*", "browse")),
                             GrantAcl(validate_grant("bob", "x", "produce"))]
    for op in theirs:
        dst.apply(op)
    dm.changed.clear()
    ops = dst.install(snap)
    assert dm.users.names() == ["admin", "bob"]
    # each user's sessions are rechecked once, against the whole new state (bob's grants are
    # revoked and granted again on the way: that alone must end none of his sessions)
    assert dm.changed == ["admin (seeded)", "bob", "carol"]
    assert dm.acls.records() == sm.acls.records() and dst.seeded
    assert PutMeta(SEEDED_KEY, "group") in ops and DropUser("carol") in ops
    # what the store gets leaves it as the member is now: replay the ops on an empty member
    again, am = security()
    for op in ops:
        if not isinstance(op, PutMeta):
            again.apply(op)
    assert am.users.names() == ["admin", "bob"] and am.acls.records() == sm.acls.records()


def test_a_login_proved_with_a_record_stands_unless_it_changed_meanwhile_or_the_seed_replaced_it() -> None:
    sec, m = security()
    local = user("admin", "admin", salt=b"mine")
    m.users.put(local)
    m.users.put(user("bob"))
    assert sec.current(local) and sec.current(user("bob"))
    m.users.put(user("bob", salt=b"a new password"))
    assert not sec.current(user("bob"))  # its password changed during the exchange
    m.users.drop("bob")
    assert not sec.current(user("bob"))
    sec.apply(SeedAdmin(user("admin", "admin", salt=b"node1's"), "node1"))
    assert sec.current(local)  # the group's first admin replaced the one it was proved with
    assert sec.current(user("admin", "admin", salt=b"node1's"))
