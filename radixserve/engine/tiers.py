"""The lower KV tiers an engine runs with, built from its config (the disk tier for now)."""

from __future__ import annotations

import logging

from radixserve.cache import RadixCache
from radixserve.engine.config import EngineConfig
from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import DiskStore
from radixserve.memory.tiers.disk_tier import LAYOUT, DiskTier
from radixserve.model.fingerprint import weights_fingerprint

logger = logging.getLogger(__name__)


def create_disk_tier(config: EngineConfig, model, pool: KVPool, cache: RadixCache):
    """The disk tier, if configured and its folder can be written (else logged, and None).
    Its folder is named by the weights, dtype, page size and page layout, so pages never
    cross models."""
    if config.disk_cache_dir is None:
        return None
    fingerprint = f"{weights_fingerprint(model)}-{config.dtype}-p{config.page_size}-{LAYOUT}"
    capacity = int(config.disk_cache_size_gb * 2**30)
    try:
        store = DiskStore(config.disk_cache_dir, fingerprint, capacity)
    except OSError as exc:
        logger.error("disk cache off: %s", exc)
        return None
    tier = DiskTier(pool, store, fingerprint)
    cache.on_evict = tier.demote
    return tier
