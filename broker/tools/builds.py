"""Another build of Tandem to run beside this one: a git ref of this repository made into a
venv (``tandem drill rolling-upgrade --from REF``), or a venv given as it is (``--from-venv``).

A ref's tree is exported (``git archive``) into a cache directory, one per commit, and a
venv is made for it.  Where this process's environment already has every dependency the
ref's ``pyproject.toml`` asks for, the venv reuses them (a ``.pth`` naming this environment's
site-packages, after the ref's tree): no download, a few seconds; a build whose borrowed
environment is gone (a deleted clone's venv) is made again on its next use.  Otherwise the ref is
installed into its venv with pip, as a user would.  Either way the build's own code is the
ref's: its tree comes first on the venv's path.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from filelock import FileLock
from packaging.requirements import Requirement

from client.errors import InvalidArgumentError

log = logging.getLogger("tandem.tools")

#: the repository this module belongs to (a build's ref is one of its commits)
REPO = Path(__file__).resolve().parents[2]
#: where built refs are kept between runs
CACHE = Path(os.environ.get("TANDEM_BUILDS_CACHE", Path.home() / ".cache" / "tandem-builds"))


@dataclass(frozen=True)
class OtherBuild:
    """A build of Tandem in a venv of its own: ``python -m broker.cli`` with :attr:`python` runs it."""

    python: Path
    label: str  # what it is, for reports: the commit's short id, or the venv's path

    def command(self) -> list[str]:
        """The argv that runs this build's ``tandem`` (``-P``: never the working directory's code)."""
        return [str(self.python), "-P", "-m", "broker.cli"]

    def env(self) -> dict[str, str]:
        """The environment its processes run with: this one's, without a PYTHONPATH that would
        put this build's code before its own."""
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def version(self) -> str:
        """The build's product version (``broker.__version__``)."""
        out = subprocess.run([str(self.python), "-P", "-c", "import broker; print(broker.__version__)"],
                             env=self.env(), capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise InvalidArgumentError(f"build {self.label}: its python cannot import broker: "
                                       f"{out.stderr.strip()[-300:]}")
        return out.stdout.strip()


def from_venv(path: Path) -> OtherBuild:
    """The build installed in the venv at ``path``."""
    python = Path(path) / "bin" / "python"
    if not python.exists():
        raise InvalidArgumentError(f"--from-venv {path}: no bin/python there (a venv with Tandem installed)")
    build = OtherBuild(python, str(path))
    build.version()  # (refused here, named, if it holds no Tandem)
    return build


def resolve(ref: str, repo: Path = REPO) -> str:
    """The full commit id of ``ref`` in ``repo``; InvalidArgumentError naming it if there is none."""
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise InvalidArgumentError(f"--from {ref}: not a commit of the repository at {repo}")
    return out.stdout.strip()


def from_ref(ref: str, repo: Path = REPO, cache: Path = CACHE) -> OtherBuild:
    """The build of git ref ``ref`` of ``repo``, made on first use and kept in ``cache``."""
    commit = resolve(ref, repo)
    home = cache / commit
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / f"{commit}.lock")):  # (two drills making one build: the second waits, then uses it)
        if not (home / "ready").exists() or not _whole(home):
            _make(repo, commit, home)
    return OtherBuild(home / "venv" / "bin" / "python", commit[:7])


def _make(repo: Path, commit: str, home: Path) -> None:
    python = home / "venv" / "bin" / "python"
    label = commit[:7]
    shutil.rmtree(home, ignore_errors=True)
    src = home / "src"
    src.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise InvalidArgumentError(f"--from {label}: git archive failed")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    missing = _missing(src / "pyproject.toml")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    if missing:
        log.warning("build %s: installing it with pip (this environment lacks %s)", label, ", ".join(missing))
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(src)], check=True)
    else:
        # the ref's tree first, then this environment's dependencies (no .pth of it is run: the
        # editable install of this build's own code is not on the path)
        (site / "00-tandem-build.pth").write_text(f"{src}\n{sysconfig.get_paths()['purelib']}\n")
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", str(src)], check=False)  # (each start reads them)
    (home / "ready").write_text(commit + "\n")


def _whole(home: Path) -> bool:
    """Whether a made build still has what it runs on: the environment whose dependencies it
    borrowed (its ``.pth``) may have been deleted since (a clone's venv), and then it is made anew."""
    return all(Path(line).is_dir() for pth in home.glob("venv/lib/python*/site-packages/00-tandem-build.pth")
               for line in pth.read_text().splitlines() if line.strip())


def _missing(pyproject: Path) -> list[str]:
    """The requirements of ``pyproject`` (its dependencies) this environment does not satisfy."""
    deps = tomllib.loads(pyproject.read_text())["project"].get("dependencies", [])
    out = []
    for spec in deps:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(spec)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{spec} (have {have})")
    return out
