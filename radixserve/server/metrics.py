"""Prometheus metrics: engine counters read at scrape time, latency histograms observed as
requests finish."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixserve.engine.client import EngineClient

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _EngineCollector:
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self):
        s = self.engine.cache_stats()
        counters = {
            "radixserve_prefix_cache_queries": ("prompt tokens looked up", s["queried_tokens"]),
            "radixserve_prefix_cache_hits": (
                "prompt tokens served from the cache",
                s["hit_tokens"],
            ),
            "radixserve_generation_tokens": ("tokens generated", s["generated_tokens"]),
            "radixserve_requests_finished": ("requests finished", s["finished_requests"]),
            "radixserve_preemptions": ("requests preempted", s["preemptions"]),
            "radixserve_spec_verify_steps": ("steps that verified draft tokens", s["verify_steps"]),
        }
        for source in ("tree", "ngram"):
            counters[f"radixserve_spec_draft_tokens_{source}"] = (
                f"draft tokens proposed from {source} matches",
                s[f"draft_tokens_{source}"],
            )
            counters[f"radixserve_spec_accepted_tokens_{source}"] = (
                f"draft tokens from {source} matches the model accepted",
                s[f"accepted_tokens_{source}"],
            )
        if "disk_pages" in s:  # the disk tier is on
            counters |= {
                "radixserve_disk_cache_hits": (
                    "prompt tokens read back from the disk tier",
                    s["disk_hit_tokens"],
                ),
                "radixserve_disk_cache_written_bytes": (
                    "bytes sealed to disk",
                    s["disk_bytes_written"],
                ),
                "radixserve_disk_cache_read_bytes": ("bytes read back", s["disk_bytes_read"]),
                "radixserve_disk_cache_load_seconds": ("seconds loading pages", s["disk_load_s"]),
                "radixserve_disk_cache_corrupted_pages": (
                    "pages dropped by their checksum",
                    s["disk_pages_corrupted"],
                ),
            }
        if "host_pages" in s:  # the host tier is on
            counters |= {
                "radixserve_host_cache_hits": (
                    "prompt tokens copied back from the host tier",
                    s["host_hit_tokens"],
                ),
                "radixserve_host_cache_loaded_pages": (
                    "pages copied back into the pool",
                    s["host_pages_loaded"],
                ),
            }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        gauges = {
            "radixserve_requests_running": ("requests running", s["running"]),
            "radixserve_requests_waiting": ("requests waiting", s["waiting"]),
            "radixserve_kv_cache_usage": ("share of KV slots in use", s["kv_usage"]),
            "radixserve_prefix_cache_tokens": ("tokens held by the tree", s["cached_tokens"]),
            "radixserve_generation_throughput": (
                "generated tokens per second since start",
                s["generation_throughput"],
            ),
            "radixserve_prefill_budget_tokens": (
                "prefill tokens the last prefilling step was allowed (token budget or ITL target)",
                s["prefill_budget_tokens"],
            ),
            "radixserve_spec_mean_accepted_length": (
                "draft tokens accepted per verifying step",
                s["mean_accepted_length"],
            ),
            "radixserve_compute_threads": (
                "threads the model's parallel regions use now (fewer while another process "
                "keeps a core busy)",
                s["compute_threads"],
            ),
            "radixserve_memory_dedup_ratio": (
                "context tokens of running requests per distinct KV slot",
                s["memory_dedup_ratio"],
            ),
        }
        if "disk_pages" in s:
            gauges["radixserve_disk_cache_bytes"] = (
                "bytes the disk tier holds",
                s["disk_bytes_used"],
            )
        if "host_pages" in s:
            gauges["radixserve_host_cache_bytes"] = (
                "bytes the host tier holds",
                s["host_bytes_used"],
            )
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: EngineClient) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram(
            "radixserve_time_to_first_token_seconds",
            "time from arrival to the first token",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "radixserve_e2e_request_latency_seconds",
            "time from arrival to the last token",
            buckets=_BUCKETS,
            registry=self.registry,
        )

    def observe(self, meta: dict) -> None:
        self.ttft.observe(meta["ttft_s"])
        self.e2e.observe(meta["latency_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
