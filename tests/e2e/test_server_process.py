"""The real ``radixserve serve`` command in its own process: graceful SIGTERM with requests
in flight, and the bounded load check that ``radixserve bench serve`` runs."""

import json
import threading
import time

import httpx
import pytest

from radixserve.bench.http_load import ChatLoad, ServerProcess
from radixserve.bench.http_load_bench import ServeBenchConfig, run_serve_bench, server_flags


def _stream_completion(url: str, max_tokens: int, events: list, first: threading.Event) -> None:
    body = {"prompt": "once upon a time", "max_tokens": max_tokens, "ignore_eos": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()
    except httpx.HTTPError as exc:  # a cut-off stream is an outcome the test inspects
        events.append(exc)
    finally:
        first.set()


def _finish_reasons(events: list) -> list:
    chunks = [json.loads(e) for e in events if isinstance(e, str) and e != "[DONE]"]
    return [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]


def test_sigterm_lets_open_streams_finish_then_refuses_new_work():
    with ServerProcess(["--model", "tiny", "--page-size", "4"]) as server:
        events: list = []
        first = threading.Event()
        client = threading.Thread(target=_stream_completion, args=(server.url, 300, events, first))
        client.start()
        assert first.wait(60)
        assert server.stop(timeout_s=60)
        client.join(10)
        assert not client.is_alive()
        assert events[-1] == "[DONE]"
        assert _finish_reasons(events)[-1] == "length"
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health")


def test_sigterm_aborts_what_outlives_the_shutdown_timeout():
    args = ["--model", "tiny", "--page-size", "4", "--shutdown-timeout", "1"]
    with ServerProcess(args) as server:
        events: list = []
        first = threading.Event()
        client = threading.Thread(target=_stream_completion, args=(server.url, 4000, events, first))
        client.start()
        assert first.wait(60)
        start = time.monotonic()
        assert server.stop(timeout_s=60)
        assert time.monotonic() - start < 30  # 4000 tokens would take far longer
        client.join(10)
        assert not client.is_alive()
        assert "length" not in _finish_reasons(events)
        assert "timeout graceful shutdown exceeded" in server.output()


def test_bench_serve_at_a_fixed_rate_has_no_errors_and_hits_the_shared_prompts():
    load = ChatLoad(requests=24, concurrency=8, request_rate=40.0, max_tokens=6, system_prompts=2)
    cfg = ServeBenchConfig(model="tiny", load=load, configs=("mixed", "alternating+chunk=64"))
    done = []
    data = run_serve_bench(cfg, lambda: done.append(1))
    assert len(done) == 48
    for row in data["rows"]:
        assert row["errors"] == 0, row["first_error"]
        assert row["invariants"] == "ok"
        assert row["shutdown"] == "graceful"
        # 2 system prompts of ~400 tokens each computed once, then reused by 22 requests
        assert 0.7 < row["hit_rate"] <= row["optimal_hit_rate"]
        assert row["ttft_p50_ms"] > 0 and row["itl_p50_ms"] > 0
    (pair,) = data["pairs"]
    assert pair["config"] == "alternating+chunk=64" and pair["itl_p99_ms"] > 0


def test_bench_serve_labels_name_server_flags():
    assert server_flags("alternating+off+chunk=256") == [
        "--no-mixed-batches",
        "--disable-prefix-cache",
        "--chunked-prefill-size",
        "256",
    ]
    assert server_flags("itl=250") == ["--itl-target-ms", "250"]
    assert server_flags("page=1") == ["--page-size", "1"]
    assert server_flags("mixed+neighbour+fixed-threads") == []  # conditions of the run
    for bad in ("fast", "chunk=", "itl=soon"):
        with pytest.raises(ValueError):
            server_flags(bad)
