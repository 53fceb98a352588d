"""WorkerCache: explicit keys, per-fit lifetimes, room for two concurrent fits (issue 5, item 13)."""

import pytest

from sparkdl.core.cache import WorkerCache


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_entries_live_per_fit_and_two_concurrent_fits_do_not_evict_each_other():
    cache = WorkerCache(max_fits=4)
    for round_ in range(5):  # two fits interleaving their rounds, as CrossValidator(parallelism=2) does
        for fit in ("a", "b"):
            built = []
            value = cache.get_or_create(fit, ("partition", 0), lambda: built.append(1) or f"{fit}-rows")
            assert value == f"{fit}-rows"
            assert built == ([1] if round_ == 0 else [])  # built once per fit, never rebuilt
    assert cache.fits() == ["a", "b"]


def test_least_recently_used_fit_goes_first_beyond_max_fits():
    cache = WorkerCache(max_fits=2)
    cache.put("a", "replica", 1)
    cache.put("b", "replica", 2)
    cache.get("a", "replica")  # a is now the most recent
    cache.put("c", "replica", 3)
    assert cache.fits() == ["a", "c"]
    assert cache.get("b", "replica") is None


def test_release_of_an_entry_or_a_whole_fit():
    cache = WorkerCache()
    cache.put("a", ("partition", 0), "x0")
    cache.put("a", ("partition", 1), "x1")
    cache.put("a", "replica", "r")
    cache.release("a", ("partition", 0))
    assert sorted(map(str, cache.keys("a"))) == ["('partition', 1)", "replica"]
    cache.release("a")
    assert cache.keys("a") == [] and cache.fits() == []
    cache.release("never-held")  # no error


def test_idle_fits_expire_at_the_next_access():
    clock = Clock()
    cache = WorkerCache(idle_s=100.0, clock=clock)
    cache.put("failed-fit", "replica", "r")
    clock.now = 50.0
    cache.put("live-fit", "replica", "r")
    clock.now = 120.0
    assert cache.get("live-fit", "replica") == "r"  # idle 70 s: kept; failed-fit idle 120 s: dropped
    assert cache.fits() == ["live-fit"]


def test_max_fits_must_be_positive():
    with pytest.raises(ValueError, match="max_fits must be >= 1. Received: 0"):
        WorkerCache(max_fits=0)
