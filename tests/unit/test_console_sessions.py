"""Console logins last SESSION_TTL on the node's monotonic clock: a wall-clock step (NTP, an
operator's date -s) neither ends nor stretches them."""

from __future__ import annotations

from broker.security.acl import AclTable
from broker.security.standing import standing_of
from broker.security.users import UserRegistry
from client.testing import FakeClock
from storage.base import UserRecord
from webconsole.auth import SESSION_TTL, Sessions

ADMIN = standing_of(UserRegistry([UserRecord(name="admin", salt=b"s", hash=b"h", role="admin",
                                             params="scram-sha-256:i=4096")]), AclTable(), "admin")
assert ADMIN is not None


class SteppedClock(FakeClock):
    """A fake clock whose wall clock can be stepped without time passing."""

    def step_wall(self, seconds: float) -> None:
        self._wall += seconds


def test_a_wall_clock_step_neither_ends_nor_stretches_a_login() -> None:
    clock = SteppedClock()
    sessions = Sessions(clock)
    token, _ = sessions.open(ADMIN)
    clock.step_wall(SESSION_TTL + 3600)  # hours forward
    assert sessions.valid(token) is not None
    clock.step_wall(-3 * SESSION_TTL)  # far back
    clock.advance(SESSION_TTL + 1)
    assert sessions.valid(token) is None
