"""The authorization map (docs/security.md, "Authorization map") is complete and names real
tests: every frame a client may send, every kind of forwarded request and every route of the
console's router has one row, no row names an operation that no longer exists, and every row
names a test that does (file::function, or a file).

The operations come from the code (tests/security/surface.py: a node's table of client requests,
broker.messaging.forward's request table, the console application's router), so adding one without its
row fails here."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.security.surface import client_frames, console_routes, forward_kinds

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
MAP = "## Authorization map"
#: the map's tables, by the heading of their subsection
CLIENT, PEER, CONSOLE, OTHER = ("### Client port: frames", "### Peer port: forwarded requests",
                                "### Console and admin REST API: routes", "### Paths without a frame of their own")
_TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")
_CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    table: str
    line: int  # in docs/security.md, for the failure message
    cells: list[str]

    @property
    def names(self) -> list[str]:
        """What the first cell names in backticks."""
        return _CODE.findall(self.cells[0])

    @property
    def key(self) -> str:
        names = self.names
        return names[0] if names else self.cells[0]

    @property
    def tests(self) -> list[tuple[str, str | None]]:
        return [(m.group(1), m.group(2)) for m in _TEST_REF.finditer(self.cells[-1])]

    def __str__(self) -> str:
        return f"docs/security.md:{self.line} ({self.cells[0]})"


def parse_map(text: str) -> dict[str, list[Row]]:
    """The rows of each table of the map: heading -> rows (header and rule lines left out)."""
    lines = text.splitlines()
    try:
        start = lines.index(MAP)
    except ValueError:
        raise AssertionError(f"docs/security.md has no section {MAP!r}") from None
    tables: dict[str, list[Row]] = {}
    heading = ""
    in_table = False
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("### "):
            heading, in_table = line, False
            tables.setdefault(heading, [])
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table:  # the header row, then the rule under it
            in_table = True
            continue
        if set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        tables[heading].append(Row(heading, number, cells))
    return tables


@functools.cache
def the_map() -> dict[str, list[Row]]:
    tables = parse_map(DOC.read_text())
    for heading in (CLIENT, PEER, CONSOLE, OTHER):
        assert tables.get(heading), f"the authorization map has no table under {heading!r}"
    return tables


def _compare(what: str, rows: list[Row], expected: set[str], where: str) -> None:
    documented = [r.key for r in rows]
    twice = sorted({k for k in documented if documented.count(k) > 1})
    missing = sorted(expected - set(documented))
    gone = [str(r) for r in rows if r.key not in expected]
    problems = []
    if missing:
        problems.append(f"{what} with no row in the authorization map (docs/security.md, {where}): "
                        f"{', '.join(missing)}")
    if gone:
        problems.append(f"rows of the authorization map naming {what} that no longer exist: {', '.join(gone)}")
    if twice:
        problems.append(f"{what} with more than one row: {', '.join(twice)}")
    assert not problems, "\n".join(problems)


def test_every_client_frame_has_a_row() -> None:
    _compare("client frames", the_map()[CLIENT], {cls.__name__ for cls in client_frames()},
             f"{CLIENT[4:]!r}; the frames of a node's request table (broker.sessions.session.requests) "
             "and the handshake's")


def test_every_forwarded_kind_has_a_row() -> None:
    rows = the_map()[PEER]
    kinds = forward_kinds()
    _compare("forwarded request kinds", rows, {k.name for k in kinds}, f"{PEER[4:]!r}; broker.messaging.forward.ForwardKind")
    classes = {k.name: cls.__name__ for k, cls in kinds.items()}
    wrong = [f"{r} names {r.names[1:]}, the kind's request is {classes[r.key]}"
             for r in rows if r.key in classes and r.names[1:] != [classes[r.key]]]
    assert not wrong, "\n".join(wrong)


def test_every_console_route_has_a_row() -> None:
    _compare("console routes", the_map()[CONSOLE], {f"{m} {p}" for m, p in console_routes()},
             f"{CONSOLE[4:]!r}; the router of webconsole.app.make_app")


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_row_names_a_test_that_exists() -> None:
    problems = []
    for rows in the_map().values():
        for row in rows:
            if not row.tests:
                problems.append(f"{row}: names no test (tests/...py::test_...)")
            for file, function in row.tests:
                path = ROOT / file
                if not path.exists():
                    problems.append(f"{row}: {file} does not exist")
                    continue
                if function is not None and function not in _functions(path):
                    problems.append(f"{row}: {file} has no test {function}")
    assert not problems, "\n".join(problems)


_SAMPLE = f"""# Security

{MAP}

{CLIENT}

| frame | who | test |
|---|---|---|
| `Publish` | `produce` | `tests/a.py::test_a` |
| `Status` | anyone | |

{PEER}

| kind | sent when | checked | test |
|---|---|---|---|
| `PUBLISH` (`PublishFwd`) | a publish | `produce` | `tests/b.py` |

## Limits

| not | the | map |
|---|---|---|
| `x` | y | z |
"""


def test_the_parser_reads_each_table_of_the_section_and_nothing_after_it() -> None:
    tables = parse_map(_SAMPLE)
    assert list(tables) == [CLIENT, PEER]
    publish, status = tables[CLIENT]
    assert (publish.key, publish.tests, publish.line) == ("Publish", [("tests/a.py", "test_a")], 9)
    assert (status.key, status.tests) == ("Status", [])
    (fwd,) = tables[PEER]
    assert (fwd.key, fwd.names, fwd.tests) == ("PUBLISH", ["PUBLISH", "PublishFwd"], [("tests/b.py", None)])


def test_a_missing_row_and_a_stale_row_are_named() -> None:
    """The failure says which operation is missing and which row is stale."""
    rows = parse_map(_SAMPLE)[CLIENT]
    with pytest.raises(AssertionError) as err:
        _compare("client frames", rows, {"Publish", "Subscribe"}, "sample")
    assert "client frames with no row in the authorization map (docs/security.md, sample): Subscribe" \
        in str(err.value)
    assert "rows of the authorization map naming client frames that no longer exist: " \
           "docs/security.md:10 (`Status`)" in str(err.value)
