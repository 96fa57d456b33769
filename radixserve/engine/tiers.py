"""The lower KV tiers an engine runs with, built from its config: host memory over disk,
either alone, or none."""

from __future__ import annotations

import logging

from radixserve.cache import RadixCache
from radixserve.engine.config import EngineConfig
from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import DiskStore
from radixserve.memory.tiers.disk_tier import LAYOUT, DiskTier
from radixserve.memory.tiers.host_tier import HostTier
from radixserve.model.fingerprint import weights_fingerprint

logger = logging.getLogger(__name__)


def create_tiers(config: EngineConfig, model, pool: KVPool, cache: RadixCache):
    """The top lower tier (pages the cache evicts go there), or None. Keys are salted by
    the weights, dtype, page size and page layout, and the disk folder is named by them, so
    pages never cross models. A disk folder that cannot be written is logged and left out."""
    if config.disk_cache_dir is None and not config.host_cache_size_gb:
        return None
    fingerprint = f"{weights_fingerprint(model)}-{config.dtype}-p{config.page_size}-{LAYOUT}"
    tier = None
    if config.disk_cache_dir is not None:
        capacity = int(config.disk_cache_size_gb * 2**30)
        try:
            store = DiskStore(config.disk_cache_dir, fingerprint, capacity)
            tier = DiskTier(pool, store, fingerprint)
        except OSError as exc:
            logger.error("disk cache off: %s", exc)
    if config.host_cache_size_gb:
        tier = HostTier(pool, int(config.host_cache_size_gb * 2**30), fingerprint, tier)
    if tier is not None:
        cache.on_evict = tier.demote
    return tier
