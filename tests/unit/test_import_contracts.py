"""The import-linter contracts bite: one forbidden import planted in a copy of the tree breaks
its contract, by name, for every contract in ``pyproject.toml``; the untouched copy keeps them all.

Each test lints its own copy of the packages and ``pyproject.toml`` in a tmp dir (nothing is
shared between xdist workers); a ``lint-imports`` run takes about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "client", "storage", "ha", "webconsole")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

STORAGE = "no import cycles among the modules of storage"
HA = "no import cycles among the modules of ha"
LAYERS = ("broker is layered: cli over tools over node over amqp over sessions over partitions over modes, arbiters "
          "and transactions over peers over security over messaging")
CONSOLE = ("the console uses what the node exposes for it (webconsole.nodeview), not the node, its modes, arbiters "
           "or links")

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


CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]

#: one forbidden import per contract, each into a module that does not import it now
PLANTED = {
    "ha is sans-IO: it imports no other part of Tandem": ("ha.errors", "broker.config"),
    "client (SDK and wire protocol) imports no broker, storage, ha or console code": ("client.clock", "storage.base"),
    "storage imports no broker or console code": ("storage.memory", "broker.config"),
    "only the entry point wires the console into the broker": ("broker.node.node", "webconsole.app"),
    LAYERS: ("broker.messaging.queues", "broker.peers.peers"),
    "the two HA modes are independent of each other": ("broker.modes.shared.mode", "broker.modes.replicated.group"),
    "only the node imports the HA modes: nothing else asks which mode is running":
        ("broker.partitions.moves", "broker.modes.replicated.group"),
    "only the command line imports the tools": ("broker.security.tls", "broker.tools.certs"),
    CONSOLE: ("webconsole.metrics", "broker.peers.peers"),
    # broker.messaging.catalogue imports broker.messaging.mapper: mapper importing catalogue closes a cycle
    "no import cycles among the modules of broker": ("broker.messaging.mapper", "broker.messaging.catalogue"),
    # client.connection imports client.errors: errors importing connection closes a cycle
    "no import cycles among the modules of client": ("client.errors", "client.connection"),
    # storage.memory imports storage.base: base importing memory closes a cycle
    STORAGE: ("storage.base", "storage.memory"),
    # ha.roles imports ha.errors: errors importing roles closes a cycle
    HA: ("ha.errors", "ha.roles"),
}


def test_every_contract_has_a_planted_import() -> None:
    assert sorted(c["name"] for c in CONTRACTS) == sorted(PLANTED)


@pytest.mark.parametrize("contract", sorted(PLANTED))
def test_a_planted_import_breaks_its_contract(tmp_path: Path, contract: str) -> None:
    module, imported = PLANTED[contract]
    tree = copy_tree(tmp_path)
    plant(tree, module, imported)
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout + result.stderr
    assert f"{' '.join(contract.split())} BROKEN" in " ".join(result.stdout.split()), result.stdout + result.stderr
