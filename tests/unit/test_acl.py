"""broker.security.acl: roles, grants by queue pattern, and the refusals' wording."""

from __future__ import annotations

import pytest

from broker.security.acl import PERMISSIONS, AclTable, matches, parse_permissions, validate_grant, validate_pattern
from client.errors import AccessRefusedError, ErrorCode, InvalidArgumentError
from storage.base import AclRecord, UserRecord


def user(name: str, role: str = "user") -> UserRecord:
    return UserRecord(name=name, salt=b"", hash=b"", role=role, params="")


BOB, AMY = user("bob"), user("amy")


def table(*grants: tuple[str, str, str]) -> AclTable:
    return AclTable(validate_grant(u, p, perms) for u, p, perms in grants)


@pytest.mark.parametrize(("pattern", "queue", "hit"), [
    ("orders.*", "orders.eu", True), ("orders.*", "orders.", True), ("orders.*", "orders", False),
    ("orders.*", "payments", False), ("*", "anything.at.all", True), ("orders.??", "orders.eu", True),
    ("orders.??", "orders.emea", False), ("Orders.*", "orders.eu", False), ("orders.eu", "orders.eu", True),
])
def test_patterns_are_case_sensitive_globs(pattern: str, queue: str, hit: bool) -> None:
    assert matches(pattern, queue) is hit


def test_a_user_may_do_what_its_grants_allow_and_nothing_else() -> None:
    acls = table(("bob", "orders.*", "consume"))
    assert acls.allows(BOB, "consume", "orders.eu")
    assert not acls.allows(BOB, "produce", "orders.eu")
    for perm in PERMISSIONS:
        assert not acls.allows(BOB, perm, "payments")
        assert not acls.allows(AMY, perm, "orders.eu")  # grants are per user
    assert acls.may_see(BOB, "orders.eu") and not acls.may_see(BOB, "payments")


def test_grants_on_several_patterns_add_up() -> None:
    acls = table(("bob", "orders.*", "consume"), ("bob", "*.eu", "produce,browse"))
    assert acls.permissions(BOB, "orders.eu") == {"consume", "produce", "browse"}
    assert acls.permissions(BOB, "orders.us") == {"consume"}
    assert acls.permissions(BOB, "payments.eu") == {"produce", "browse"}


def test_roles_admin_everything_monitor_looks_and_grants_add_to_a_role() -> None:
    admin, monitor = user("root", "admin"), user("watch", "monitor")
    acls = table(("watch", "audit", "consume"))
    assert all(acls.allows(admin, p, "payments") for p in PERMISSIONS) and acls.group_admin(admin)
    assert acls.permissions(monitor, "payments") == {"browse"}
    assert acls.permissions(monitor, "audit") == {"browse", "consume"}
    assert not acls.group_admin(monitor)
    assert acls.permissions(user("x", "no-such-role"), "q") == frozenset()


def test_the_admin_permission_is_granted_on_every_queue_only() -> None:
    acls = table(("bob", "*", "admin"))
    assert acls.group_admin(BOB) and not acls.group_admin(AMY)
    with pytest.raises(InvalidArgumentError, match="group permission"):
        validate_grant("bob", "orders.*", "admin")


def test_revoke_takes_what_it_names_and_a_pattern_with_nothing_left_goes() -> None:
    acls = table(("bob", "orders.*", "produce,consume"), ("bob", "*", "browse"))
    acls.revoke(validate_grant("bob", "orders.*", "produce,configure"))
    assert acls.records("bob") == [AclRecord(user="bob", pattern="*", permissions=("browse",)),
                                   AclRecord(user="bob", pattern="orders.*", permissions=("consume",))]
    acls.revoke(validate_grant("bob", "orders.*", "consume"))
    acls.revoke(validate_grant("bob", "*", "all"))
    assert acls.records() == [] and acls.records("bob") == []


def test_dropping_a_user_drops_its_grants() -> None:
    acls = table(("bob", "orders.*", "consume"), ("amy", "*", "browse"))
    acls.drop_user("bob")
    assert [(a.user, a.pattern) for a in acls.records()] == [("amy", "*")]


def test_refusals_name_the_user_the_permission_and_the_queue() -> None:
    acls = table(("bob", "orders.*", "consume"))
    with pytest.raises(AccessRefusedError) as err:
        acls.check(BOB, "produce", "orders.eu")
    assert err.value.code is ErrorCode.ACCESS_REFUSED
    assert all(word in err.value.message for word in ("'bob'", "'produce'", "'orders.eu'"))
    acls.check(BOB, "consume", "orders.eu")  # allowed: no error
    with pytest.raises(AccessRefusedError, match="'bob'.*'admin'.*manage users"):
        acls.check_group(BOB, "manage users")


@pytest.mark.parametrize(("text", "expected"), [
    ("consume", ("consume",)), ("Browse, produce", ("produce", "browse")), ("all", PERMISSIONS),
    (["configure", "consume", "consume"], ("consume", "configure")),
])
def test_permissions_parse_in_canonical_order(text: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_permissions(text) == expected


@pytest.mark.parametrize(("text", "why"), [("write", "unknown permission 'write'"), ("", "no permission"),
                                           (" , ", "no permission")])
def test_unknown_or_missing_permissions_are_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=why):
        parse_permissions(text)


@pytest.mark.parametrize("pattern", ["", "a" * 256, "orders.[ab]", "orders eu", "x;y"])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidArgumentError, match="pattern"):
        validate_pattern(pattern)


def test_a_grant_needs_a_user() -> None:
    with pytest.raises(InvalidArgumentError, match="user"):
        validate_grant("", "*", "browse")
