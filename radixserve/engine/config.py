"""The engine's settings: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.chat.reasoning_parsers import reasoning_format
from radixserve.chat.tool_parsers import TOOL_PARSERS

POLICIES = ("lpm", "dfs-weight", "fcfs", "random")
DTYPES = ("float32", "bfloat16", "float16")
SPECULATIVE_METHODS = ("ngram",)
CACHE_INDEXES = ("radix", "block-hash")
EVICTION_POLICIES = ("lru", "lfu")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"
    page_size: int = 1
    max_total_tokens: int | None = None  # KV slots in the pool; default 65536
    mem_fraction: float | None = None  # or: this share of free (GPU or host) memory
    max_running_requests: int = 64
    schedule_policy: str = "lpm"
    lpm_aging_tokens_per_s: float = 2000.0  # how fast waiting raises an LPM priority
    chunked_prefill_size: int = 2048  # tokens per step, decodes counted
    # steps carry every running decode plus prefill chunks (False: prefill and decode passes
    # take turns, and running requests wait while prompts prefill)
    mixed_batches: bool = True
    # size the prefill of a step carrying decodes so the step (every running request's
    # inter-token latency) is predicted to take at most this long, and at most itl_ratio
    # times what its decodes alone take (the ratio keeps the tail of inter-token latency
    # near its median on any machine); None for both: the token budget alone
    itl_target_ms: float | None = None
    itl_ratio: float | None = 2.0
    enable_prefix_cache: bool = True
    cache_index: str = "radix"  # or "block-hash": vLLM's way, kept for comparison
    # which unlocked leaf the tree evicts first: "lru", or "lfu" (with aging)
    eviction_policy: str = "lru"
    attention_backend: str = "auto"
    # requests sharing a tree path attend over it once (backends that support it: native),
    # when they share at least cascade_min_shared tokens (below that the merge costs about
    # what the saved reads do)
    cascade_attention: bool = True
    cascade_min_shared: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    # which weights stay or become quantized (``radixserve.model.quantized_model``): "auto"
    # serves a GGUF file's quantized tensors as they are, "none" widens them to ``dtype``,
    # "int8" / "int4" also quantize float projections at load (CPU)
    quantize: str = "auto"
    seed: int = 0
    # keep freed host memory for reuse (glibc's mmap/trim thresholds and one arena,
    # process-wide): CPU forward passes stop faulting in fresh pages for every temporary
    tune_malloc: bool = True
    # keep the projections' and output weights again in their faster paths' layouts: column
    # panels for a decode step's rows (float32; bfloat16 with AVX512_BF16), oneDNN's where
    # its GEMM is the faster one for more (the ``CpuProfile`` says where): up to twice their
    # size again
    pack_weights: bool = True
    # the CPU fast paths to take (``radixserve.cpu.CpuProfile``, or the path of one saved
    # as JSON): pinned, the same kernels run on any machine that can run them; None: the
    # profile this machine's features give (the same in every process on it)
    cpu_profile: Any = None
    # a disk tier under the KV pool: pages leaving the pool are kept in this folder (bounded
    # by disk_cache_size_gb) and read back when a prompt's prefix runs past the pool's; a
    # new engine on the folder hits what an earlier one wrote. write_policy "write_back"
    # writes pages as they are evicted, "write_through" as soon as their request finishes
    disk_cache_dir: str | None = None
    disk_cache_size_gb: float = 16.0
    # a host-memory tier between the pool and the disk (0: none): pinned RAM for a GPU
    # engine's evicted pages, copied back layer by layer on a side stream. A CPU engine's
    # pool is host memory already: there it only adds copies (a larger pool is better)
    host_cache_size_gb: float = 0.0
    write_policy: str = "write_back"
    # write every finished request to this file as a trace (hashed pages, no tokens) for
    # ``radixserve simulate``
    record_trace: str | None = None
    # a grammar (structured output) that takes longer to compile fails its request
    grammar_compile_timeout_s: float = 10.0
    # how tool calls are written in the model's text (``engine/tool_calls.py``): hermes,
    # llama3_json, or auto (the one the chat template shows)
    tool_call_parser: str = "auto"
    # how reasoning is marked in the text (``engine/reasoning.py``): qwen3, deepseek_r1;
    # None: the text is all answer
    reasoning_parser: str | None = None
    # speculative decoding without a draft model (``engine/drafts.py``): "ngram" drafts from
    # the tree's cached continuations, else n-gram matches in the request's own text, up to
    # speculative_tokens a step, verified by the next pass; None: off
    speculative: str | None = None
    speculative_tokens: int = 6
    check_invariants: bool = False  # audit the tree after every step (slow; for tests)

    @property
    def routing_fingerprint(self) -> str:
        """What names this engine's pages to a router across replicas (with the page size,
        which ``page_keys`` takes apart)."""
        return f"{self.model}-p{self.page_size}"

    def __post_init__(self) -> None:
        if self.schedule_policy not in POLICIES:
            raise ValueError(
                f"unknown schedule_policy {self.schedule_policy!r}; choose one of {POLICIES}"
            )
        if self.cache_index not in CACHE_INDEXES:
            raise ValueError(
                f"unknown cache_index {self.cache_index!r}; choose one of {CACHE_INDEXES}"
            )
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"unknown eviction_policy {self.eviction_policy!r}; "
                f"choose one of {EVICTION_POLICIES}"
            )
        if self.cache_index == "block-hash" and self.eviction_policy != "lru":
            raise ValueError("the block-hash index evicts in LRU order only")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {DTYPES}")
        from radixserve.model.quantized_model import check_quantize  # torch: not at import

        check_quantize(self.quantize, self.device)
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_total_tokens is not None and self.mem_fraction is not None:
            raise ValueError("give max_total_tokens or mem_fraction, not both")
        if self.max_total_tokens is not None and self.max_total_tokens < 4 * self.page_size:
            raise ValueError(f"max_total_tokens {self.max_total_tokens} is too small")
        if self.mem_fraction is not None and not 0 < self.mem_fraction < 1:
            raise ValueError(f"mem_fraction must be in (0, 1), got {self.mem_fraction}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.cascade_min_shared < 1:
            raise ValueError("cascade_min_shared must be >= 1")
        if self.itl_target_ms is not None and not self.itl_target_ms > 0:
            raise ValueError(f"itl_target_ms must be positive, got {self.itl_target_ms}")
        if self.itl_ratio is not None and not self.itl_ratio > 1:
            raise ValueError(f"itl_ratio must be above 1 (or None), got {self.itl_ratio}")
        if self.write_policy not in ("write_back", "write_through"):
            raise ValueError(
                f"unknown write_policy {self.write_policy!r}; choose write_back or write_through"
            )
        if self.disk_cache_dir is not None and not self.disk_cache_size_gb > 0:
            raise ValueError("disk_cache_size_gb must be positive")
        if self.host_cache_size_gb < 0:
            raise ValueError("host_cache_size_gb must be >= 0")
        tiers = self.disk_cache_dir is not None or self.host_cache_size_gb > 0
        if tiers and (self.cache_index != "radix" or not self.enable_prefix_cache):
            raise ValueError(
                "the host and disk tiers work under the radix cache (cache_index='radix')"
            )
        if not self.grammar_compile_timeout_s > 0:
            raise ValueError("grammar_compile_timeout_s must be positive")
        reasoning_format(self.reasoning_parser)  # an unknown name raises
        if self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"unknown tool_call_parser {self.tool_call_parser!r}; choose one of {TOOL_PARSERS}"
            )
        if self.speculative not in (None, *SPECULATIVE_METHODS):
            raise ValueError(
                f"unknown speculative {self.speculative!r}; choose one of {SPECULATIVE_METHODS}"
            )
        if self.speculative_tokens < 1:
            raise ValueError("speculative_tokens must be >= 1")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError("chunked_prefill_size must be at least one page")
