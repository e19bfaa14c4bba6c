"""Fixtures of the Kronecker-sparse tests: one kernel and measurement cache per session in a
temporary folder, never the user's ~/.cache/pathlift."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kron_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pathlift-cache")


@pytest.fixture(autouse=True)
def isolated_kron_cache(kron_cache_dir, monkeypatch):
    """PATHLIFT_CACHE_DIR points at the session's temporary cache (import this fixture)."""
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(kron_cache_dir))
    return kron_cache_dir
