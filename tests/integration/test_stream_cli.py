"""``tandem streams`` against a real node: declare, produce, read from first / an offset / a time,
a named consumer's reads continuing where the last one stopped, over a restart; refusals in one
line, never a traceback."""

from __future__ import annotations

import json

import pytest

from broker.tools.process import NodeProcess
from tests.helpers import tandem
from tests.integration.test_cli import proc  # noqa: F401  (the node fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


def _bodies(out: str) -> list[str]:
    return [json.loads(line)["body"] for line in out.splitlines()]


async def test_declare_read_and_a_named_consumer_over_a_restart(proc: NodeProcess) -> None:
    url = ("--url", proc.url)
    rc, out, err = await tandem("streams", "declare", "audit", "--max-age", "86400", *url)
    assert (rc, out.strip()) == (0, "stream audit declared (1 partition(s))"), err
    rc, out, err = await tandem("produce", "audit", "a1", "a2", "a3", "a4", *url)
    assert rc == 0, err
    rc, out, err = await tandem("streams", "read", "audit", *url)
    assert rc == 0 and _bodies(out) == ["a1", "a2", "a3", "a4"], err
    rc, out, _ = await tandem("streams", "read", "audit", "--from", "2", "-n", "1", *url)
    third = json.loads(out)
    assert third["body"] == "a3" and third["offset"] == 2
    rc, out, _ = await tandem("streams", "read", "audit", "--from", "last", *url)
    assert _bodies(out) == ["a4"]
    rc, out, _ = await tandem("streams", "read", "audit", "--since", "2000-01-01T00:00:00+00:00", "-n", "1", *url)
    assert _bodies(out) == ["a1"]
    rc, out, _ = await tandem("streams", "read", "audit", "--consumer", "billing", "-n", "3", *url)
    assert _bodies(out) == ["a1", "a2", "a3"]
    rc, out, _ = await tandem("streams", "offset", "audit", "--consumer", "billing", *url)
    assert out.strip() == "billing at offset 3 of audit/0"
    await proc.stop()
    await proc.start()  # (the stream, its messages and the consumer's offset are the store's)
    rc, out, _ = await tandem("produce", "audit", "a5", *url)
    rc, out, err = await tandem("streams", "read", "audit", "--consumer", "billing", *url)
    assert rc == 0 and _bodies(out) == ["a4", "a5"], err
    rc, out, _ = await tandem("streams", "read", "audit", "--since", str(third["timestamp"]), *url)
    assert _bodies(out)[-3:] == ["a3", "a4", "a5"] and json.loads(out.splitlines()[0])["timestamp"] <= \
        third["timestamp"]  # (from a3, or a message stored in the same millisecond before it)
    rc, out, _ = await tandem("streams", "offset", "audit", "--consumer", "billing", "--set", "0", *url, "--json")
    assert json.loads(out)["offset"] == 0
    for bad, says in [(("read", "audit", "--from", "middle"), "--from 'middle': an offset, first, last or next"),
                      (("read", "audit", "--since", "yesterday"), "--since 'yesterday': seconds since the epoch"),
                      (("offset", "audit"), "tandem streams offset needs --consumer NAME"),
                      (("read", "nosuch"), "queue 'nosuch' does not exist")]:
        rc, out, err = await tandem("streams", *bad, *url)
        assert rc != 0 and says in err and "Traceback" not in err, (bad, err)
    rc, out, err = await tandem("consume", "audit", "-n", "1", *url)
    assert rc != 0 and "is a stream: it is not consumed" in err and "Traceback" not in err
