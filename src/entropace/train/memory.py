"""The trainer's memory helpers (:mod:`entropace._memory`, shared with the rollout worker
process): allocator tuning, returning freed heap, RSS metrics."""

from entropace._memory import (  # noqa: F401 (re-export)
    MMAP_THRESHOLD,
    memory_metrics,
    peak_rss_mib,
    release_memory,
    rss_mib,
    tune_allocator,
)
