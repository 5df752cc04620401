"""docs/architecture.md's Layout names every module of the product, and nothing that is gone."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "client", "storage", "ha", "webconsole")


def layout_paths() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("```\n", text.index("## Layout")) + 4
    block = text[start:text.index("```", start)]
    return {line.split()[0] for line in block.splitlines() if line.strip() and not line.startswith("tests/")}


def modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def test_the_layout_lists_every_module_and_no_other() -> None:
    listed, present = layout_paths(), modules()
    assert not present - listed, f"modules missing from docs/architecture.md's Layout: {sorted(present - listed)}"
    assert not listed - present, f"the Layout names modules that do not exist: {sorted(listed - present)}"
