"""``entropace.train.memory``: freed heap memory goes back to the kernel, RSS is measured."""

from __future__ import annotations

import os
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


#: 2 MiB blocks freed between kept ones, after one 40 MiB block was freed (which raises glibc's
#: dynamic mmap threshold to 40 MiB, as a first large tensor freed in a training step does).
BLOCKS = """
import sys
from entropace.train.memory import rss_mib, tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator() is True
first = bytearray(40 << 20)
del first
blocks = [bytearray(b"\\x01" * (2 << 20)) for _ in range(150)]  # 300 MiB
keep = blocks[::50]
del blocks
print(rss_mib())
"""


def _python(code: str, *args: str, **env: str) -> str:
    import subprocess

    full = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=full, check=True
    )
    return out.stdout.strip().splitlines()[-1]


@glibc
def test_tune_allocator_gives_large_blocks_back_when_freed() -> None:
    """With the tuned allocator each 2 MiB block had its own mapping and the RSS falls as soon
    as it is freed; with glibc's default they stay in the heap."""
    default, tuned = float(_python(BLOCKS, "default")), float(_python(BLOCKS, "tuned"))
    assert default - tuned > 150, (default, tuned)  # of 294 MiB freed


@glibc
def test_a_users_malloc_mmap_threshold_is_left_alone() -> None:
    code = "from entropace.train.memory import tune_allocator; print(tune_allocator())"
    assert _python(code, MALLOC_MMAP_THRESHOLD_="65536") == "False"
    assert _python(code) == "True"
