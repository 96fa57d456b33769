"""A script that ends without ``engine.shutdown()`` must exit cleanly: engines stop their
scheduler threads before the interpreter finalizes (a daemon thread still inside a native
op at finalization aborts the process with ``terminate called without an active
exception``)."""

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from radixserve import Engine, SamplingParams

    dtype = sys.argv[1]
    idle = Engine("tiny", dtype=dtype)
    busy = Engine("tiny", dtype=dtype, page_size=16)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    for engine in (idle, busy):
        engine.generate(input_ids=[[5, 6, 7, 8]] * 3, sampling_params=greedy)
    # structured output starts the grammar pools, which must stop too
    idle.generate("x", SamplingParams(max_new_tokens=8, regex="[a-z]{4}"))
    endless = SamplingParams(max_new_tokens=100_000, ignore_eos=True)
    # a request still running when the script ends
    threading.Thread(
        target=busy.generate, kwargs={"input_ids": [9] * 40, "sampling_params": endless},
        daemon=True,
    ).start()
    time.sleep(0.2)
    print("done")
    """
)
RUNS = 10


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_script_that_never_shuts_its_engines_down_exits_cleanly(dtype):
    def run(_: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, dtype], capture_output=True, text=True, timeout=120
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(RUNS)))
    failures = [(r.returncode, r.stderr[-300:]) for r in results if r.returncode != 0]
    assert not failures, failures
    assert all(r.stdout.strip() == "done" for r in results)
