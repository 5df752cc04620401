"""The options of the PySpark data source (client.spark), checked once on the driver: ``load()``
fails on a bad one, in one line naming it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.errors import InvalidArgumentError
from client.url import parse_url

# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conf:
    """The options, checked once on the driver (``load()`` fails on a bad one)."""

    url: str
    queue: str
    partitions: tuple[int, ...] | None = None  # a subset, or all
    starting: str | dict[str, int] = "earliest"
    ending: str | dict[str, int] = "latest"
    min_partitions: int = 0
    max_offsets_per_trigger: int = 0
    fail_on_data_loss: bool = True
    #: instead of startingOffsets / endingOffsets: from (to) the first message stored at or after
    #: this time, in milliseconds since the epoch (0: not given)
    starting_timestamp: int = 0
    ending_timestamp: int = 0
    query_id: str | None = None
    offsets_dir: str = field(default_factory=lambda: str(Path.home() / ".tandem" / "spark-initial-offsets"))

    @staticmethod
    def parse(options: dict[str, str], *, streaming: bool = False) -> Conf:
        opts = {k.lower(): v for k, v in options.items()}
        url = opts.get("url")
        if not url:
            raise InvalidArgumentError("option url is required: tandem://user:password@host:port[,host:port...]")
        params = parse_url(url)  # bad URLs fail here, on the driver
        # Rebuilt with the credentials resolved here (options, the URL, or TANDEM_PASSWORD in
        # the driver's environment): executors have neither the options nor that environment.
        user = opts.get("user") or params.user
        password = opts["password"] if opts.get("password") is not None else params.password
        url = group_url(params.hosts, user, password, params)
        queue = opts.get("queue")
        if not queue:
            raise InvalidArgumentError("option queue is required")
        parts = None
        if opts.get("partitions"):
            try:
                parts = tuple(sorted({int(p) for p in opts["partitions"].split(",") if p.strip()}))
            except ValueError:
                raise InvalidArgumentError("option partitions: comma-separated partition numbers") from None
        return Conf(url=url, queue=queue, partitions=parts,
                    starting=_offsets_option(opts, "startingoffsets", "latest" if streaming else "earliest"),
                    ending=_offsets_option(opts, "endingoffsets", "latest"),
                    min_partitions=_int_option(opts, "minpartitions", 0),
                    max_offsets_per_trigger=_int_option(opts, "maxoffsetspertrigger", 0),
                    fail_on_data_loss=_bool_option(opts, "failondataloss", True),
                    query_id=_query_id(opts.get("queryid")),
                    starting_timestamp=_int_option(opts, "startingtimestamp", 0),
                    ending_timestamp=_int_option(opts, "endingtimestamp", 0),
                    offsets_dir=opts.get("initialoffsetsdir") or str(Path.home() / ".tandem" / "spark-initial-offsets"))


_CANONICAL = {"startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets",
              "minpartitions": "minPartitions", "maxoffsetspertrigger": "maxOffsetsPerTrigger",
              "failondataloss": "failOnDataLoss", "startingtimestamp": "startingTimestamp",
              "endingtimestamp": "endingTimestamp"}


def group_url(hosts: Sequence[tuple[str, int]], user: str, password: str, params: Any) -> str:
    """A ``tandem://`` URL of ``hosts`` with the credentials spelled out (executors get it)."""
    from urllib.parse import quote

    scheme = "tandems" if params.tls else "tandem"
    query = f"?name={quote(params.client_name, safe='')}&connect_timeout={params.connect_timeout}"
    if params.tls and params.ca:
        query += f"&ca={quote(params.ca, safe='/')}"
    return (f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@"
            + ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts) + "/" + query)


def _int_option(opts: dict[str, str], name: str, default: int) -> int:
    if name not in opts:
        return default
    try:
        v = int(opts[name])
    except ValueError:
        raise InvalidArgumentError(f"option {_CANONICAL[name]}: an integer, not {opts[name]!r}") from None
    if v < 0:
        raise InvalidArgumentError(f"option {_CANONICAL[name]}: must be >= 0")
    return v


def _query_id(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", v):
        raise InvalidArgumentError("option queryId: 1-128 letters, digits, '_', '.', '-'")
    return v


def _bool_option(opts: dict[str, str], name: str, default: bool) -> bool:
    v = opts.get(name)
    if v is None:
        return default
    if v.lower() not in ("true", "false"):
        raise InvalidArgumentError(f"option {_CANONICAL[name]}: true or false, not {v!r}")
    return v.lower() == "true"


def _offsets_option(opts: dict[str, str], name: str, default: str) -> str | dict[str, int]:
    v = opts.get(name, default)
    if v in ("earliest", "latest"):
        return v
    try:
        parsed = json.loads(v)
        if not isinstance(parsed, dict) or not all(isinstance(o, int) and o >= 0 for o in parsed.values()):
            raise ValueError
        return {str(int(k)): int(o) for k, o in parsed.items()}
    except (ValueError, TypeError):
        raise InvalidArgumentError(f'option {_CANONICAL[name]}: earliest, latest or JSON like {{"0": 42, "1": 7}}, '
                                   f"not {v!r}") from None
