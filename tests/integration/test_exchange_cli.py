"""``tandem exchanges``, ``tandem bind`` / ``unbind`` and ``tandem produce --exchange`` against a real
node: what each prints, the refusals in one line, and the exchanges kept over a restart (a node
without a group raises its own feature level with its first exchange)."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.tools.process import NodeProcess
from tests.helpers import tandem
from tests.integration.test_cli import proc  # noqa: F401  (the node fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


async def test_exchanges_bindings_and_produce_to_an_exchange(proc: NodeProcess) -> None:
    url = ("--url", proc.url)
    rc, out, err = await tandem("exchanges", "declare", "logs", "--type", "topic", *url)
    assert (rc, out.strip()) == (0, "exchange logs declared (topic)"), err
    rc, out, _ = await tandem("exchanges", "declare", "logs", "--type", "topic", *url)
    assert out.strip() == "exchange logs exists (topic)"
    for q in ("errors", "everything"):
        assert (await tandem("queues", "declare", q, *url))[0] == 0
    rc, out, err = await tandem("bind", "logs", "errors", "--routing-key", "*.error", *url)
    assert rc == 0 and "queue errors bound to exchange logs (key '*.error')" in out, err
    assert (await tandem("bind", "logs", "everything", "--routing-key", "#", *url))[0] == 0
    rc, out, err = await tandem("produce", "--exchange", "logs", "--routing-key", "app.error", "e1", "e2", *url)
    assert rc == 0 and "2 message(s) confirmed on exchange logs" in out, err
    rc, out, err = await tandem("produce", "--exchange", "logs", "--routing-key", "app.info", "i1", *url, "--json")
    assert json.loads(out)["unroutable"] == 0
    rc, out, _ = await tandem("exchanges", *url, "--json")
    (logs,) = json.loads(out)
    assert logs["type"] == "topic" and sorted(b["destination"] for b in logs["bindings"]) == ["errors", "everything"]
    await proc.stop()
    await proc.start()  # (the exchange and its bindings are the store's)
    rc, out, _ = await tandem("exchanges", *url)
    assert "logs (topic)" in out and "-> queue errors  key='*.error'" in out
    rc, out, err = await tandem("consume", "errors", "-n", "2", *url, "--json")
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["e1", "e2"]
    rc, out, err = await tandem("consume", "everything", "-n", "3", *url, "--json")
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["e1", "e2", "i1"]
    assert (await tandem("unbind", "logs", "everything", "--routing-key", "#", *url))[0] == 0
    rc, out, err = await tandem("produce", "--exchange", "logs", "--routing-key", "x", "--mandatory", "m", *url)
    assert rc == 2 and "routed to no queue (mandatory): nothing of the batch was stored" in err and \
        "Traceback" not in err
    rc, out, err = await tandem("produce", "--exchange", "logs", "--routing-key", "x", "m", *url)
    assert rc == 0 and "(1 routed to no queue: dropped)" in out
    assert (await tandem("exchanges", "delete", "logs", *url))[0] == 0
    rc, out, _ = await tandem("exchanges", *url)
    assert out.strip() == "(no exchanges)"


REFUSALS = [
    (["exchanges", "declare", "amq.x"], "names starting with 'amq.' are reserved"),
    (["exchanges", "declare", "x", "--alternate", "ghost"], "alternate exchange 'ghost': no such exchange"),
    (["exchanges", "delete", "ghost"], "no exchange 'ghost'"),
    (["exchanges", "delete"], "needs an exchange name"),
    (["bind", "ghost", "q"], "no exchange 'ghost'"),
    (["bind", "x", "q", "--header", "nonsense"], "expected KEY=VALUE"),
    (["produce", "--exchange", "ghost", "m"], "no exchange 'ghost'"),
    (["produce", "q", "--routing-key", "k"], "go with --exchange"),
]


async def test_refusals_are_one_line(proc: NodeProcess) -> None:
    async def refused(args: list[str], needle: str) -> None:
        rc, out, err = await tandem(*args, "--url", proc.url)
        assert rc == 2 and needle in err and "Traceback" not in err, (args, out, err)

    await asyncio.gather(*(refused(args, needle) for args, needle in REFUSALS))
