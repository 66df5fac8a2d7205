"""``entropace.train.memory``: freed heap memory goes back to the kernel, RSS is measured."""

from __future__ import annotations

import sys

import pytest

from entropace.train.memory import memory_metrics, peak_rss_mib, release_memory, rss_mib

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not release_memory(), reason="needs glibc"
)


@glibc
def test_release_memory_returns_freed_heap_pages() -> None:
    """Blocks of 64 KiB (under glibc's mmap threshold: served from the heap), 99 of 100
    freed with every 100th kept: the freed space sits between live blocks, where ``free`` does
    not give it back; ``release_memory`` does."""
    release_memory()
    blocks = [bytearray(b"\x01" * (64 * 1024)) for _ in range(4000)]  # ~250 MiB, touched
    keep = blocks[::100]
    del blocks
    before = rss_mib()
    assert release_memory() is True
    after = rss_mib()
    assert before - after > 150, (before, after)
    assert len(keep) == 40


def test_memory_metrics_are_the_process_figures() -> None:
    m = memory_metrics()
    assert set(m) == {"memory/rss_mib", "memory/peak_rss_mib"}
    assert 0 < m["memory/rss_mib"] <= m["memory/peak_rss_mib"] * 1.001 + 1
    assert peak_rss_mib() >= m["memory/peak_rss_mib"]
