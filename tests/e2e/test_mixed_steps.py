"""Mixed prefill+decode steps change when tokens come, never which: greedy outputs equal
transformers' with mixed steps on and off, with an ITL target or ratio, with the cache on and off,
under preemption and chunking, at page sizes 1 and 16; logprobs, parallel samples, stop
strings and seeds are what the alternating engine gives."""

import pytest

from radixserve import Engine, SamplingParams
from tests.e2e.engine_runs import run, workload

MODES = {
    "alternating": {"mixed_batches": False},
    "mixed": {"itl_ratio": None},  # the token budget alone
    "mixed-ratio": {},  # the default: at most twice the decodes' time
    "mixed-itl": {"itl_target_ms": 5.0},
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("pool, chunk", [(4096, 2048), (192, 32)])
def test_greedy_outputs_do_not_depend_on_the_step_mode(reference, page_size, cache, pool, chunk):
    stats = {}
    for mode, options in MODES.items():
        outs, stats[mode] = run(
            page_size=page_size,
            enable_prefix_cache=cache,
            max_total_tokens=pool,
            chunked_prefill_size=chunk,
            **options,
        )
        assert outs == reference, mode
    assert stats["alternating"]["mixed_steps"] == 0
    if chunk < 2048:  # prompts arrive over several steps, so some run beside decodes
        assert stats["mixed"]["mixed_steps"] > 0
    if pool < 4096:
        assert stats["mixed"]["preemptions"] > 0


def varied_requests() -> list[tuple[list[int], SamplingParams]]:
    prompts = workload()
    return [
        (prompts[0], SamplingParams(max_new_tokens=8, temperature=0, return_logprob=True)),
        (
            prompts[1],
            SamplingParams(
                max_new_tokens=6,
                temperature=0,
                return_logprob=True,
                top_logprobs_num=2,
                logprob_start_len=3,
            ),
        ),
        (prompts[2], SamplingParams(max_new_tokens=10, temperature=0.9, n=3, seed=11)),
        (prompts[3], SamplingParams(max_new_tokens=10, temperature=1.0, top_k=20, seed=5)),
        (prompts[4], SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(500,))),
        (prompts[5], SamplingParams(max_new_tokens=12, temperature=0, stop=[" the", "a"])),
        (prompts[6], SamplingParams(max_new_tokens=9, temperature=0, ignore_eos=True)),
    ]


def outputs(**options) -> list[dict]:
    reqs = varied_requests()
    options |= {"page_size": 4, "chunked_prefill_size": 24, "check_invariants": True}
    with Engine("tiny", **options) as e:
        outs = e.generate(input_ids=[p for p, _ in reqs], sampling_params=[s for _, s in reqs])
        assert options.get("mixed_batches") is False or e.cache_stats()["mixed_steps"] > 0
    return outs


def test_logprobs_samples_stops_and_seeds_do_not_depend_on_the_step_mode():
    alternating = outputs(mixed_batches=False)
    for mixed in (outputs(), outputs(itl_ratio=None), outputs(itl_target_ms=5.0)):
        assert len(mixed) == len(alternating) == 9  # n=3 gives three outputs
        for a, b in zip(alternating, mixed, strict=True):
            assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
            ma, mb = a["meta_info"], b["meta_info"]
            assert ma["finish_reason"] == mb["finish_reason"]
            for key in ("output_token_logprobs", "input_token_logprobs"):
                pa, pb = ma.get(key) or [], mb.get(key) or []
                assert [t for _, t in pa] == [t for _, t in pb]
                assert all(abs(x - y) < 1e-4 for (x, _), (y, _) in zip(pa, pb, strict=True))
