"""The engine workload the end-to-end tests share, and one run of it with audits."""

from dataclasses import replace

import numpy as np

from radixserve import Engine, SamplingParams
from radixserve.cpu import probe_cpu_profile

GREEDY = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)


def workload() -> list[list[int]]:
    """Prompts that share prefixes: one system prompt, several users, two turns of one."""
    rng = np.random.default_rng(0)
    system = rng.integers(3, 1000, 40).tolist()
    users = [rng.integers(3, 1000, n).tolist() for n in (5, 9, 17, 3, 26)]
    prompts = [system + u for u in users]
    prompts.append(prompts[0] + rng.integers(3, 1000, 7).tolist())
    prompts.append(rng.integers(3, 1000, 33).tolist())  # shares nothing
    return prompts


def run(cascade_min_queries: int | None = None, **options) -> tuple[list[list[int]], dict]:
    if cascade_min_queries is not None:  # the tiny batch is below the default
        profile = replace(probe_cpu_profile(), cascade_min_queries=cascade_min_queries)
        options["cpu_profile"] = profile
    with Engine("tiny", check_invariants=True, **options) as engine:
        outs = engine.generate(input_ids=workload(), sampling_params=GREEDY)
        stats = engine.cache_stats()
        engine.check_invariants()
        assert stats["kv_used"] == stats["cached_tokens"]  # nothing held outside the tree
        assert engine.flush_cache()
        assert engine.allocator.num_free == engine.allocator.capacity
    return [o["token_ids"] for o in outs], stats
