"""The default cache directory: $DPAUDIT_CACHE_DIR, else $XDG_CACHE_HOME/dpaudit, else ~/.cache/dpaudit."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpaudit.cache import default_cache_dir, resolve_cache_dir


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.delenv("DPAUDIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_home_cache_by_default(env, tmp_path):
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "dpaudit"


def test_xdg_cache_home(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "dpaudit"


@pytest.mark.parametrize("value", ["", "relative/cache"])
def test_empty_or_relative_xdg_cache_home_is_ignored(env, tmp_path, value):
    env.setenv("XDG_CACHE_HOME", value)  # the XDG spec: relative paths are invalid, ignore them
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "dpaudit"


def test_dpaudit_cache_dir_wins_and_is_absolute(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    env.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    env.setenv("DPAUDIT_CACHE_DIR", "rel")
    assert default_cache_dir() == tmp_path / "rel" and default_cache_dir().is_absolute()
    env.setenv("DPAUDIT_CACHE_DIR", "")
    assert default_cache_dir() == tmp_path / "xdg" / "dpaudit"


def test_creates_nothing(env, tmp_path):
    default_cache_dir()
    assert not any(tmp_path.iterdir())


def test_resolve_cache_dir(env, tmp_path):
    assert resolve_cache_dir(None) == default_cache_dir()
    assert resolve_cache_dir("x") == Path("x")
    assert resolve_cache_dir(tmp_path / "y") == tmp_path / "y"
