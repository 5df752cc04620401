"""The Node only wires its parts and runs their lifecycle (docs/architecture.md, Decisions):
its module stays at most 400 lines and the class at most 25 public members, counting its
methods, properties and the attributes it sets.  What a subsystem needs goes to the part that
owns it (broker/node/services.py, parts.py), not onto the Node."""

from __future__ import annotations

import ast
from pathlib import Path

NODE = Path(__file__).resolve().parents[2] / "broker" / "node" / "node.py"
MAX_LINES = 400
MAX_PUBLIC = 25


def public_members(source: str, cls: str) -> set[str]:
    """The public names of ``cls``: its methods and properties, and every ``self.x = ...``."""
    tree = ast.parse(source)
    [node] = [c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls]
    names = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store)
              and isinstance(a.value, ast.Name) and a.value.id == "self"}
    return {n for n in names if not n.startswith("_")}


def test_the_node_module_is_at_most_400_lines() -> None:
    lines = len(NODE.read_text().splitlines())
    assert lines <= MAX_LINES, f"broker/node/node.py is {lines} lines"


def test_the_node_has_at_most_25_public_members() -> None:
    members = public_members(NODE.read_text(), "Node")
    assert len(members) <= MAX_PUBLIC, f"Node has {len(members)} public members: {sorted(members)}"


def test_the_count_sees_methods_properties_and_attributes() -> None:
    source = '''
class Node:
    def __init__(self):
        self.a = 1
        self._hidden = 2
    @property
    def b(self): ...
    async def c(self): ...
    def _d(self): ...
    def e(self):
        self.f = 3
'''
    assert public_members(source, "Node") == {"a", "b", "c", "e", "f"}
