"""The engine's settings: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """Each field is also a ``radixserve serve`` flag (``engine/config_flags.py``), its
    ``help`` the flag's help and its row in docs/engine.md's options table."""

    model: str = field(
        default="tiny",
        metadata={
            "help": "the model: a named one (`radixserve pull --list`), a GGUF file, a Hugging "
            "Face directory or id, or a preset (tiny, bench-135m)"
        },
    )
    page_size: int = field(
        default=16,
        metadata={"help": "tokens per KV page: the unit the prefix cache shares and evicts"},
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata={
            "help": "KV cache size in tokens (slots in the pool); none: 65536, or what "
            "mem_fraction gives"
        },
    )
    mem_fraction: float | None = field(
        default=None,
        metadata={
            "help": "size the KV cache to this share of free GPU (or host) memory, in (0, 1), "
            "instead of max_total_tokens"
        },
    )
    max_running_requests: int = field(
        default=64, metadata={"help": "most requests running at once; the rest wait"}
    )
    schedule_policy: str = field(
        default="lpm",
        metadata={
            "help": "the waiting queue's order: lpm (longest cached prefix first, with aging), "
            "dfs-weight, fcfs or random"
        },
    )
    lpm_aging_tokens_per_s: float = field(
        default=2000.0,
        metadata={
            "help": "lpm: each second a request waits counts as this many cached tokens, so "
            "requests that share nothing are not starved (tokens per second)"
        },
    )
    chunked_prefill_size: int = field(
        default=2048,
        metadata={
            "help": "most tokens a step computes, decodes counted; longer prompts prefill in "
            "chunks (tokens)"
        },
    )
    mixed_batches: bool = field(
        default=True,
        metadata={
            "help": "steps carry every running decode beside prefill chunks (off: prefill and "
            "decode passes take turns, and running requests wait while prompts prefill)"
        },
    )
    # size the prefill of a step carrying decodes so the step (every running request's
    # inter-token latency) is predicted to take at most this long, and at most itl_ratio
    # times what its decodes alone take (the ratio keeps the tail of inter-token latency
    # near its median on any machine); None for both: the token budget alone
    itl_target_ms: float | None = field(
        default=None,
        metadata={
            "help": "size a step's prefill beside decodes so the step (their inter-token "
            "latency) is predicted to take at most this long (milliseconds); none: no target"
        },
    )
    itl_ratio: float | None = field(
        default=2.0,
        metadata={
            "help": "a step prefilling beside decodes takes at most this many times what "
            "they alone take (above 1); none (or 0): no such cap, only the token budget"
        },
    )
    enable_prefix_cache: bool = field(
        default=True,
        metadata={
            "help": "reuse the K/V of prompt prefixes computed before (off: every prompt is "
            "computed whole)"
        },
    )
    cache_index: str = field(
        default="radix",
        metadata={
            "help": "the prefix cache's index: radix (the radix tree), or block-hash (vLLM's "
            "hashed blocks, kept for comparison)"
        },
    )
    eviction_policy: str = field(
        default="lru",
        metadata={"help": "which cached prefix is evicted first: lru, or lfu (with aging)"},
    )
    attention_backend: str = field(
        default="auto",
        metadata={
            "help": "auto, torch, native (CPU kernels) or flashinfer (CUDA); auto: flashinfer "
            "on CUDA where installed, native on CPU where it runs, else torch"
        },
    )
    # under cascade_min_shared shared tokens the merge costs about what the saved reads do
    cascade_attention: bool = field(
        default=True,
        metadata={
            "help": "requests sharing a cached prefix attend over it once (backends that "
            "support it: native)"
        },
    )
    cascade_min_shared: int = field(
        default=64,
        metadata={"help": "fewest tokens requests must share for cascade attention (tokens)"},
    )
    dtype: str = field(
        default="float32",
        metadata={"help": "the weights' and K/V's type: float32, bfloat16 or float16"},
    )
    device: str = field(default="cpu", metadata={"help": "where to run: cpu, or cuda"})
    # which weights stay or become quantized (``radixserve.model.quantized_model``)
    quantize: str = field(
        default="auto",
        metadata={
            "help": "auto: a GGUF file's quantized tensors served as they are; none: widened "
            "to dtype; int8, int4: float projections quantized at load too (groups of 32, "
            "CPU)"
        },
    )
    seed: int = field(default=0, metadata={"help": "the random seed sampling starts from"})
    # glibc's mmap/trim thresholds and one arena, process-wide
    tune_malloc: bool = field(
        default=True,
        metadata={
            "help": "keep freed host memory for reuse (glibc malloc, process-wide): CPU passes "
            "stop faulting in fresh pages for every temporary"
        },
    )
    # column panels for a decode step's rows (float32; bfloat16 with AVX512_BF16), oneDNN's
    # where its GEMM is the faster one for more (the ``CpuProfile`` says where)
    pack_weights: bool = field(
        default=True,
        metadata={
            "help": "keep the projection and output weights again in the CPU fast paths' "
            "layouts (faster; up to twice their memory)"
        },
    )
    # a ``radixserve.cpu.CpuProfile`` too: pinned, the same kernels run on any machine that
    # can run them; None: the profile this machine's features give (the same in every
    # process on it)
    cpu_profile: Any = field(
        default=None,
        metadata={
            "help": "pin the CPU fast paths to a profile saved by `radixserve cpu-profile "
            "--save` (a JSON file); none: the ones this machine's features give",
            "metavar": "FILE",
        },
    )
    # a new engine on the folder hits what an earlier one wrote
    disk_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "a disk tier under the KV cache: pages leaving it are kept in this folder "
            "and read back on a hit, by later engines too; none: no disk tier",
            "metavar": "DIR",
        },
    )
    disk_cache_size_gb: float = field(
        default=16.0, metadata={"help": "most the disk tier holds (GB)"}
    )
    # A CPU engine's pool is host memory already: there it only adds copies (a larger pool
    # is better)
    host_cache_size_gb: float = field(
        default=0.0,
        metadata={
            "help": "a pinned host-memory tier between a GPU's KV cache and the disk (GB; 0: none)"
        },
    )
    write_policy: str = field(
        default="write_back",
        metadata={
            "help": "when the disk tier writes a page: write_back (as it is evicted) or "
            "write_through (as soon as its request finishes)"
        },
    )
    record_trace: str | None = field(
        default=None,
        metadata={
            "help": "write every finished request to this file as a trace (hashed pages, no "
            "tokens) for `radixserve simulate`",
            "metavar": "FILE",
        },
    )
    grammar_compile_timeout_s: float = field(
        default=10.0,
        metadata={
            "help": "a request whose grammar (structured output) takes longer to compile "
            "fails (seconds)"
        },
    )
    # ``engine/tool_calls.py``
    tool_call_parser: str = field(
        default="auto",
        metadata={
            "help": "how the model writes tool calls: hermes (`<tool_call>` blocks), "
            "llama3_json, or auto (from the chat template; hermes where it shows none)"
        },
    )
    # ``engine/reasoning.py``
    reasoning_parser: str | None = field(
        default=None,
        metadata={
            "help": "return `<think>` blocks as reasoning_content: qwen3 (the model opens "
            "them), deepseek_r1 (the template does); none: the text is all answer"
        },
    )
    # ``engine/drafts.py``: the drafts are verified by the next pass
    speculative: str | None = field(
        default=None,
        metadata={
            "help": "ngram: speculative decoding with drafts from the cache's continuations, "
            "else n-gram matches in the request's own text (same outputs); none: off"
        },
    )
    speculative_tokens: int = field(
        default=6, metadata={"help": "the most draft tokens a step (speculative decoding)"}
    )
    check_invariants: bool = field(
        default=False,
        metadata={"help": "audit the prefix cache after every step (slow; for tests)"},
    )

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
