"""A tree's digest tells a router how far the tree reaches into a request, by hashed
page chains only: exact while the tree fits the bound, to within a stride past it, never
more than the tree holds, and never across namespaces."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cache import RadixCache
from radixserve.cache.digest import TreeDigest, tree_digest

PAGE = 4


def tree(seqs, namespaces=None) -> RadixCache:
    cache = RadixCache(PAGE)  # simulation mode: slots are plain ints
    for i, seq in enumerate(seqs):
        ns = None if namespaces is None else namespaces[i]
        cache.insert(np.asarray(seq, dtype=np.int32), np.arange(len(seq)), ns)
    return cache


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 2), min_size=PAGE, max_size=40), min_size=1, max_size=8),
    query=st.lists(st.integers(0, 2), max_size=48),
    max_keys=st.sampled_from([16, 24, 10_000]),  # 8 leaves at most: the stride bounds
)
def test_the_digest_never_claims_more_than_the_tree_holds(seqs, query, max_keys):
    seqs = [s[: len(s) - len(s) % PAGE] for s in seqs]
    cache = tree(seqs)
    digest = tree_digest(cache, "m", max_keys)
    assert len(digest.keys) <= max_keys
    q = np.asarray(query, dtype=np.int32)
    held = cache.peek_prefix(q)[0] // PAGE * PAGE
    found = digest.matched_tokens(q, None)
    assert found <= held and found % PAGE == 0
    if max_keys == 10_000:
        assert digest.stride == 1 and found == held  # under the bound: exact
    else:
        assert held - found < digest.stride * PAGE


def test_namespaces_never_match_each_other():
    seq = list(range(16))
    digest = tree_digest(tree([seq], ["tenant-a"]), "m")
    assert digest.matched_tokens(np.array(seq), "tenant-a") == 16
    assert digest.matched_tokens(np.array(seq), "tenant-b") == 0
    assert digest.matched_tokens(np.array(seq), None) == 0


def test_a_digest_travels_as_a_dict():
    digest = tree_digest(tree([list(range(12))]), "m")
    again = TreeDigest.from_dict(digest.to_dict())
    assert again == digest and again.matched_tokens(np.arange(12), None) == 12
