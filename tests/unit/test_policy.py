import random

import numpy as np

from radixserve.cache import RadixCache
from radixserve.engine.req import Req
from radixserve.engine.sampling_params import SamplingParams
from radixserve.engine.scheduler.policy import order_waiting


def make(tokens, arrival):
    req = Req(f"r{arrival}", np.array(tokens, dtype=np.int32), SamplingParams())
    req.arrival_s = arrival
    return req


def order(policy, cache, reqs, aging=0.0):
    def match(r):
        return cache.peek_prefix(r.seq())

    return [r.rid for r in order_waiting(reqs, policy, match, aging, random.Random(0))]


def setup():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], np.arange(6))
    cache.insert([9, 9], np.arange(6, 8))
    reqs = [
        make([7, 7, 7], 0.0),  # no hit
        make([9, 9, 1], 1.0),  # 2 cached
        make([1, 2, 3, 4, 5, 6, 0], 2.0),  # 6 cached
        make([1, 2, 3, 8], 3.0),  # 3 cached
        make([9, 9, 2], 4.0),  # 2 cached
    ]
    return cache, reqs


def test_fcfs_and_lpm():
    cache, reqs = setup()
    assert order("fcfs", cache, reqs[::-1]) == ["r0.0", "r1.0", "r2.0", "r3.0", "r4.0"]
    assert order("lpm", cache, reqs) == ["r2.0", "r3.0", "r1.0", "r4.0", "r0.0"]


def test_lpm_aging_lets_a_cold_request_overtake():
    cache, reqs = setup()
    reqs[0].arrival_s = -1000.0  # waited long; 1 token per second of waiting
    assert order("lpm", cache, reqs, aging=1.0)[0] == "r0.0"


def test_dfs_weight_keeps_requests_under_one_prefix_together():
    cache, reqs = setup()
    got = order("dfs-weight", cache, reqs)
    assert sorted(got) == sorted(r.rid for r in reqs)
    # [9, 9] and [1, 2, 3, ...] each hold two requests: each pair stays adjacent.
    for pair in (("r1.0", "r4.0"), ("r2.0", "r3.0")):
        i, j = got.index(pair[0]), got.index(pair[1])
        assert abs(i - j) == 1
    # Deeper matches first under a prefix, and the request matching nothing last.
    assert got.index("r2.0") < got.index("r3.0")
    assert got[-1] == "r0.0"
