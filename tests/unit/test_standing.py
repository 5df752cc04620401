"""broker.security.standing: a session stands while its user does — deleted, a new password, another
role or a revoked grant end it; a grant added meanwhile joins what it rests on."""

from __future__ import annotations

import pytest

from broker.security.acl import AclTable, validate_grant
from broker.security.standing import Standing, lapsed, recheck, standing_of
from broker.security.users import UserRegistry
from storage.base import UserRecord


def bob(salt: bytes = b"salt", role: str = "user") -> UserRecord:
    return UserRecord(name="bob", salt=salt, hash=b"k" * 64, role=role, params="scram-sha-256:i=4096")


class Member:
    def __init__(self) -> None:
        self.users = UserRegistry([bob()])
        self.acls = AclTable([validate_grant("bob", "orders.*", "consume,browse")])


def login(m: Member) -> Standing:
    s = standing_of(m.users, m.acls, "bob")
    assert s is not None
    return s


def test_nothing_changed_stands() -> None:
    m = Member()
    s = login(m)
    assert lapsed(s, standing_of(m.users, m.acls, "bob")) is None
    assert recheck(m, s) == (s, None)


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: m.users.drop("bob"), "was deleted"),
    (lambda m: m.users.put(bob(salt=b"new salt")), "password of user 'bob' was changed"),
    (lambda m: m.users.put(bob(role="monitor")), "role of user 'bob' was changed (user -> monitor)"),
    (lambda m: m.acls.revoke(validate_grant("bob", "orders.*", "browse")), "revoked (browse on orders.*)"),
])
def test_a_change_that_takes_something_away_ends_the_session(change, words: str) -> None:
    m = Member()
    s = login(m)
    change(m)
    keep, why = recheck(m, s)
    assert keep is None and why is not None and words in why


def test_a_grant_added_meanwhile_is_taken_in_and_its_revocation_ends_the_session() -> None:
    m = Member()
    s = login(m)
    extra = validate_grant("bob", "payments", "produce")
    m.acls.grant(extra)
    keep, why = recheck(m, s)
    assert why is None and keep is not None and ("payments", "produce") in keep.grants
    m.acls.revoke(extra)
    assert recheck(m, keep)[1] == "a grant of user 'bob' was revoked (produce on payments)"
    # (checked against the standing at login alone, the revoke would have gone unnoticed)
    assert recheck(m, s)[1] is None


def test_the_same_password_stored_again_is_no_change_a_new_one_is() -> None:
    m = Member()
    s = login(m)
    m.users.put(bob())  # e.g. a snapshot installing the same record
    assert recheck(m, s)[1] is None
    m.users.put(UserRecord(name="bob", salt=b"salt", hash=b"j" * 64, role="user", params="scram-sha-256:i=4096"))
    assert "password" in (recheck(m, s)[1] or "")
