"""Compensation hooks (broker.partitions.compensation): found by entry point, asked about a key conflict
with both versions, and whatever they do, nothing is lost (a hook that fails leaves the
message in the quarantine).  The restore's side of it (broker.partitions.restore.compensated): the
source's version read at the old id, a merged version put back with the restore's id rules."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from broker.partitions.compensation import DROP, KEEP, Conflict, Version, load, resolve
from broker.partitions.restore import RESTORED_ID, Report, compensated, conflict_line, republished
from client.errors import InvalidArgumentError
from client.protocol.frames import StreamMessage
from tests.unit.test_restore_report import H

HOOKS = textwrap.dedent("""
    from broker.partitions.compensation import DROP, Version

    def by_body(c):
        if c.kept is not None and c.kept.body == c.discarded.body:
            return DROP
        return None

    not_callable = 42

""")

ENTRY_POINTS = textwrap.dedent("""
    [tandem.compensation]
    by_body = tandem_test_hooks:by_body
    not_callable = tandem_test_hooks:not_callable
    missing = tandem_test_hooks_absent:hook
""")


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hooks"
    root.mkdir()
    (root / "tandem_test_hooks.py").write_text(HOOKS)
    info = root / "tandem_test_hooks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-test-hooks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(root))
    return root


def _conflict(kept: bytes | None = b"theirs") -> Conflict:
    return Conflict("orders", 2, 17, "node3", Version("k", {"app": "mine"}, b"mine"),
                    None if kept is None else Version("k", {"app": "theirs"}, kept))


def test_a_hook_is_found_by_its_entry_point_and_a_bad_one_is_named(hooks: Path) -> None:
    hook = load("by_body")
    assert resolve(hook, _conflict(b"mine")).outcome == "dropped"
    assert resolve(hook, _conflict(b"theirs")).outcome == "kept"
    with pytest.raises(InvalidArgumentError, match=r"'nope' is not installed \(entry points tandem.compensation: "
                                                   r"by_body, missing, not_callable\)"):
        load("nope")
    with pytest.raises(InvalidArgumentError, match="'not_callable' .* is not callable"):
        load("not_callable")
    with pytest.raises(InvalidArgumentError, match="'missing' .* cannot be loaded: ModuleNotFoundError"):
        load("missing")


def test_what_a_hook_answers_decides_and_anything_else_fails_safe() -> None:
    c = _conflict()
    assert resolve(None, c) == resolve(lambda _c: None, c) == resolve(lambda _c: KEEP, c)
    assert resolve(None, c).outcome == "kept" and resolve(None, c).version == c.discarded
    assert resolve(lambda _c: DROP, c).outcome == "dropped"
    merged = Version("k", {"app": "both"}, b"mine+theirs")
    assert (resolve(lambda _c: merged, c).outcome, resolve(lambda _c: merged, c).version) == ("merged", merged)

    def boom(_c: Conflict) -> None:
        raise RuntimeError("no such order")

    failed = resolve(boom, c)
    assert (failed.outcome, failed.version, failed.why) == ("failed", None, "RuntimeError: no such order")
    for answer, why in ((42, "returned int 42"), ("delete", "returned str 'delete'"),
                        (Version("k", {}, "text"), "body is not bytes"),  # type: ignore[arg-type]
                        (Version(7, {}, b""), "key is not a string"),  # type: ignore[arg-type]
                        (Version("k", {"n": 1}, b""), "headers are not a map of strings")):  # type: ignore[dict-item]
        res = resolve(lambda _c, a=answer: a, c)
        assert res.outcome == "failed" and why in res.why, (answer, res)
    assert c.id == "2-17"


def test_the_restore_asks_with_both_versions_and_puts_back_what_it_decided() -> None:
    _queue, _pid, msg = republished(H, "k", b"mine")
    theirs = StreamMessage(2, 17, "k2", {"app": "theirs"}, b"theirs", 0.0, "2-17")
    later = StreamMessage(2, 18, "k3", {}, b"later", 0.0, "2-18")
    seen: list[Conflict] = []

    async def read(queue: str, partition: int, offset: int) -> list[StreamMessage]:
        assert (queue, partition, offset) == ("orders", 2, 17)
        return [theirs]

    def merge(c: Conflict) -> Version:
        seen.append(c)
        assert c.kept is not None
        return Version(c.discarded.key, {**c.kept.headers, "x-quarantine-node": "forged", "x-tandem-id": "9-9",
                                         "merged": "yes"}, c.discarded.body + b"|" + c.kept.body)

    res, put = asyncio.run(compensated(merge, H, msg, read))
    assert seen == [Conflict("orders", 2, 17, "node3", Version("k", {"app": "kept"}, b"mine"),
                             Version("k2", {"app": "theirs"}, b"theirs"))]
    assert res.outcome == "merged" and put is not None
    # the hook's headers, but never the quarantine's nor an id: the restore's rules stand
    assert put.headers == {"app": "theirs", "merged": "yes", RESTORED_ID: "2-17"}
    assert (put.key, put.body, put.seq) == ("k", b"mine|theirs", 17)

    async def trimmed(queue: str, partition: int, offset: int) -> list[StreamMessage]:
        return [later]  # (the message at 17 is no longer stored: the read starts after it)

    got: list[Conflict] = []
    res, put = asyncio.run(compensated(lambda c: got.append(c) or DROP, H, msg, trimmed))
    assert got[0].kept is None and res.outcome == "dropped" and put is None
    res, put = asyncio.run(compensated(None, H, msg, read))
    assert res.outcome == "kept" and put is msg
    assert conflict_line("orders", msg, res).startswith("restore: key conflict in orders: id 2-17 names another")


def test_a_report_says_what_the_hook_did() -> None:
    r = Report()
    r.restored["q"] += 4
    r.conflicts["q"] += 2
    r.merged["q"] += 1
    r.dropped["q"] += 3
    r.failed["q"] += 1
    assert Report.from_json(r.json()) == r
    assert r.json()["dropped"] == {"q": 3}
    lines = r.lines(narrowed=False)
    assert "1 message(s) of q restored in the version the compensation hook made of both" in lines
    assert "3 message(s) of q dropped by the compensation hook (not restored: the queue's own message stands)" in lines
    assert ("1 message(s) of q left in tandem.quarantine: the compensation hook failed on them (see the log)"
            in lines)
    assert Report.from_json({"restored": {"q": 1}}).dropped == {}  # (a member that counts no hook's work)
