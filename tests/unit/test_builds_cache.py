"""A build of another ref kept in the cache (broker.tools.builds) that borrowed an environment
since deleted is made again on its next use, not run broken."""

from __future__ import annotations

from pathlib import Path

from broker.tools import builds


def test_a_build_whose_borrowed_environment_is_gone_is_not_whole(tmp_path: Path) -> None:
    home = tmp_path / "abc"
    site = home / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    borrowed = tmp_path / "clone" / ".venv" / "site-packages"
    borrowed.mkdir(parents=True)
    (site / "00-tandem-build.pth").write_text(f"{home / 'src'}\n{borrowed}\n")
    (home / "src").mkdir()
    assert builds._whole(home)
    borrowed.rmdir()
    assert not builds._whole(home)


def test_a_build_installed_with_pip_borrows_nothing(tmp_path: Path) -> None:
    (tmp_path / "abc" / "venv" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    assert builds._whole(tmp_path / "abc")
