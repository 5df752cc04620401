"""The import-linter contracts bite: a cycle planted in a copy of the tree breaks the
``acyclic_siblings`` contract of its package, by name, and the untouched copy keeps them all.

Each test lints its own copy of the packages and ``pyproject.toml`` in a tmp dir (nothing is
shared between xdist workers); a ``lint-imports`` run takes about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "client", "storage", "ha", "webconsole")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

STORAGE = "no import cycles among the modules of storage"
HA = "no import cycles among the modules of ha"

pytestmark = pytest.mark.timeout(120)


def copy_tree(dst: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dst / package, ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def plant(tree: Path, module: str, imported: str) -> None:
    """Append ``import <imported>`` to ``module`` in the copy (never executed: import-linter
    only reads the source)."""
    path = tree.joinpath(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\nimport {imported}  # planted by {__name__}\n")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=100)


def test_the_untouched_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{STORAGE} KEPT" in result.stdout and f"{HA} KEPT" in result.stdout
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("contract", "module", "imported"), [
    # storage.memory imports storage.base: base importing memory closes a cycle
    (STORAGE, "storage.base", "storage.memory"),
    # ha.roles imports ha.errors: errors importing roles closes a cycle
    (HA, "ha.errors", "ha.roles"),
])
def test_a_planted_cycle_breaks_its_packages_contract(tmp_path: Path, contract: str, module: str,
                                                      imported: str) -> None:
    tree = copy_tree(tmp_path)
    plant(tree, module, imported)
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout, result.stdout + result.stderr
    assert "1 broken" in result.stdout, result.stdout
