"""Each DSL example runs to completion on the tiny preset and its later calls hit the cache."""

import runpy
from pathlib import Path

import pytest

import radixserve as rs

EXAMPLES = Path(__file__).parents[2] / "examples"
PROGRAMS = ["few_shot_qa", "multi_turn_chat", "tree_of_thought", "react_agent", "rag", "judge"]


@pytest.fixture(scope="module")
def engine():
    with rs.Engine("tiny", page_size=1) as eng:
        yield eng


@pytest.mark.parametrize("name", PROGRAMS)
def test_example_completes_and_hits_the_cache(name, engine, capsys):
    assert engine.flush_cache()
    before = engine.cache_stats()
    main = runpy.run_path(str(EXAMPLES / f"{name}.py"))["main"]
    result = main(backend=engine)
    states = result if isinstance(result, list) else [result]
    assert all(s.error() is None for s in states)
    after = engine.cache_stats()
    hits = after["hit_tokens"] - before["hit_tokens"]
    queried = after["queried_tokens"] - before["queried_tokens"]
    assert hits > 0.3 * queried, f"{name}: {hits} of {queried} prompt tokens hit"
    assert capsys.readouterr().out  # it shows its result
    engine.check_invariants()
