"""Fixtures of the runtime tests."""

import pytest

from metaspmd.cache import RuleCache


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A rule cache of the module's own: each module explores what it plans, in any order."""
    return RuleCache(tmp_path_factory.mktemp("rules"))


@pytest.fixture(scope="module")
def fake_world(fake_world_of, request):
    """A fake process group of the module's ``WORLD`` ranks (DTensor in one process)."""
    fake_world_of(request.module.WORLD)
