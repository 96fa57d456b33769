"""The ``radixserve`` command line: the demo, the server, models and the benchmarks.

Each command's module owns its arguments (``add_arguments``) and its work (``run``); only
the chosen one is imported, so ``radixserve --help`` does not load torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

DESCRIPTION = (
    "An LLM serving engine whose radix-tree prefix cache computes a shared prefix's K/V "
    "once. Try `radixserve demo`, then `radixserve serve --model smollm2-135m-instruct`."
)
# name: (module, help)
COMMANDS = {
    "demo": ("radixserve.bench.demo", "a chat workload served with the prefix cache on and off"),
    "simulate": ("radixserve.sim.simulate", "replay a trace: KV capacity, hit rate, eviction"),
}
BENCHES = {
    "cache": ("radixserve.bench.cache_bench", "match/insert/evict latency of the radix tree"),
    "model": ("radixserve.bench.model_bench", "forward throughput against transformers"),
    "kernels": ("radixserve.bench.kernel_bench", "native attention and matcher vs references"),
    "serve": ("radixserve.bench.serve_bench", "a load check of the HTTP server over loopback"),
    "serving": ("radixserve.bench.serving_bench", "the SGLang paper's workloads, side by side"),
    "lang": ("radixserve.bench.lang_bench", "DSL programs, prefix cache on and off"),
    "structured": ("radixserve.bench.structured_bench", "JSON extraction: masks, jump-forward"),
    "tiers": ("radixserve.bench.tiers_bench", "the disk tier: TTFT by source, restart"),
    "cluster": ("radixserve.bench.cluster_bench", "replicas on Ray Serve behind each router"),
    "spec": ("radixserve.bench.spec_bench", "speculative decoding off and on, real model"),
    "report": ("radixserve.bench.docs_report", "regenerate docs/benchmarks.md from the JSON"),
}


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from radixserve.engine import Engine
    from radixserve.server import create_app

    keys = None
    if args.api_keys:
        keys = json.loads(Path(args.api_keys).read_text())
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise ValueError("--api-keys must name a JSON object mapping each key to a tenant")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = dict(
        page_size=args.page_size,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        schedule_policy=args.schedule_policy,
        chunked_prefill_size=args.chunked_prefill_size,
        mixed_batches=not args.no_mixed_batches,
        itl_target_ms=args.itl_target_ms,
        itl_ratio=args.itl_ratio or None,
        enable_prefix_cache=not args.disable_prefix_cache,
        cache_index=args.cache_index,
        eviction_policy=args.eviction_policy,
        record_trace=args.record_trace,
        disk_cache_dir=args.disk_cache_dir,
        disk_cache_size_gb=args.disk_cache_size_gb,
        host_cache_size_gb=args.host_cache_size_gb,
        write_policy=args.write_policy,
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        quantize=args.quantize,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        speculative=args.speculative,
        speculative_tokens=args.speculative_tokens,
        device=args.device,
        seed=args.seed,
        cpu_profile=args.cpu_profile,
    )
    if args.replicas is not None:
        from radixserve.cluster.launch import serve_cluster

        spec = dict(
            model=args.model,
            replicas=args.replicas,
            router=args.router,
            engine_options=options,
            served_model_name=args.served_model_name,
            api_keys=keys,
        )
        return serve_cluster(spec, args.host, args.port, args.ray_address)
    engine = Engine(args.model, **options)
    app = create_app(engine, args.served_model_name or args.model, keys)
    # On SIGINT/SIGTERM uvicorn stops accepting and lets open requests finish; past the
    # timeout it cancels them, and the app's shutdown aborts what the engine still holds.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    return 0


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="tiny",
        help="a named model (radixserve pull --list), a GGUF file, a HF directory or id, "
        "or a preset",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-keys", help="JSON file: {key: tenant namespace}")
    p.add_argument(
        "--replicas", type=int, default=None, help="engine replicas on Ray Serve ([cluster] extra)"
    )
    p.add_argument("--router", default="prefix", help="prefix, round-robin or power-of-two")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: local)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--schedule-policy", default="lpm")
    p.add_argument(
        "--chunked-prefill-size", type=int, default=2048, help="tokens a step, decodes counted"
    )
    p.add_argument(
        "--no-mixed-batches",
        action="store_true",
        help="prefill and decode passes take turns (running requests wait while prompts fill)",
    )
    p.add_argument(
        "--itl-target-ms",
        type=float,
        default=None,
        help="size each step's prefill to keep inter-token latency near this target",
    )
    p.add_argument(
        "--itl-ratio",
        type=float,
        default=2.0,
        help="a step prefilling beside decodes lasts at most this many times what they alone "
        "take (0: no such cap, only the token budget)",
    )
    p.add_argument("--disable-prefix-cache", action="store_true")
    p.add_argument("--cache-index", default="radix", help="radix or block-hash")
    p.add_argument("--eviction-policy", default="lru", help="lru, or lfu (with aging)")
    p.add_argument("--record-trace", default=None, help="write served requests here for `simulate`")
    p.add_argument("--disk-cache-dir", default=None, help="a disk tier under the KV pool")
    p.add_argument("--disk-cache-size-gb", type=float, default=16.0)
    p.add_argument(
        "--host-cache-size-gb", type=float, default=0.0, help="pinned host RAM under a GPU pool"
    )
    p.add_argument("--write-policy", default="write_back", help="write_back or write_through")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--quantize",
        default="auto",
        help="auto: a GGUF file's quantized tensors served as they are; none: widened to "
        "--dtype; int8, int4: float projections quantized at load too (groups of 32, CPU)",
    )
    p.add_argument(
        "--tool-call-parser",
        default="auto",
        help="how the model writes tool calls: hermes (<tool_call> blocks), llama3_json, or "
        "auto (from the chat template; hermes where it shows none)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        help="return <think>...</think> as reasoning_content: qwen3 (the model opens it), "
        "deepseek_r1 (the template opens it)",
    )
    p.add_argument(
        "--speculative",
        default=None,
        help="ngram: speculative decoding with drafts from the tree's cached continuations, "
        "else n-gram matches in the request's own text (same outputs; off by default)",
    )
    p.add_argument("--speculative-tokens", type=int, default=6, help="the most draft tokens a step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-profile",
        default=None,
        metavar="FILE",
        help="pin the CPU fast paths to a profile saved by `radixserve cpu-profile --save`",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds open requests may run on after SIGTERM before they are aborted",
    )


def _export_preset(args: argparse.Namespace) -> int:
    from radixserve.model.presets import export_preset

    out = export_preset(args.name, args.directory)
    print(f"wrote preset {args.name!r} to {out}")
    return 0


def _pull(args: argparse.Namespace) -> int:
    from radixserve.model.loader import load_tokenizer
    from radixserve.model.pull import NAMED_MODELS, pull

    if args.list:
        for name, entry in NAMED_MODELS.items():
            print(f"{name:24} {entry.about} ({entry.license})")
        return 0
    if not args.name:
        raise ValueError("name a model to pull (radixserve pull --list shows them)")
    path = pull(args.name)
    load_tokenizer(args.name)  # converted once and kept beside the model
    print(f"{args.name}: {path}")
    return 0


def _cpu_profile(args: argparse.Namespace) -> int:
    from radixserve.cpu import probe_cpu_profile

    profile = probe_cpu_profile()
    if args.save:
        profile.save(args.save)
    print(json.dumps(profile.to_dict(), indent=2))
    return 0


def _add_module(sub, name: str, module: str, help: str, chosen: bool, bench: bool) -> None:
    p = sub.add_parser(name, help=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    if not chosen:  # only the command being run imports its module
        return
    mod = importlib.import_module(module)
    mod.add_arguments(p)
    if bench and name != "report":
        p.add_argument("--json", help="write the rows to this file")
        p.add_argument("--wide", action="store_true", help="every column, past 80 characters")
    p.set_defaults(func=mod.run)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """``argv`` names the command to be run, whose arguments are the only ones loaded."""
    words = [a for a in argv if not a.startswith("-")]
    parser = argparse.ArgumentParser(prog="radixserve", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help) in COMMANDS.items():
        _add_module(sub, name, module, help, words[:1] == [name], bench=False)
    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    _serve_arguments(serve)
    serve.set_defaults(func=_serve)
    pull = sub.add_parser("pull", help="fetch a named real model into the cache")
    pull.add_argument("name", nargs="?", help="e.g. smollm2-135m-instruct")
    pull.add_argument("--list", action="store_true", help="the names known")
    pull.set_defaults(func=_pull)
    cpu = sub.add_parser("cpu-profile", help="the CPU fast paths this machine takes")
    cpu.add_argument("--save", metavar="FILE", help="also write it here, for --cpu-profile")
    cpu.set_defaults(func=_cpu_profile)
    export = sub.add_parser("export-preset", help="write a built-in model as a HF directory")
    export.add_argument("name", help="tiny or bench-135m")
    export.add_argument("directory")
    export.set_defaults(func=_export_preset)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    for name, (module, help) in BENCHES.items():
        _add_module(bench, name, module, help, words[:2] == ["bench", name], bench=True)
    return parser


# libgomp reads these once, when torch loads it (the commands import torch after main starts).
# Between parallel regions an OpenMP team's workers spin before they sleep, but while the
# process holds more OpenMP threads than cores (a second thread that ran one parallel torch
# op holds a team of its own) libgomp cuts that spin to 100 turns, and each of a decode
# step's regions then waits for its worker to be woken by the kernel. Active waiting makes
# the cut spin 1,000 turns; GOMP_SPINCOUNT keeps the usual spin at libgomp's default (active
# alone would spin without end).
OPENMP_ENV = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "300000"}


def openmp_defaults(env: MutableMapping[str, str]) -> None:
    """``OPENMP_ENV`` into ``env`` unless the user set either variable."""
    if not any(name in env for name in OPENMP_ENV):
        env.update(OPENMP_ENV)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    openmp_defaults(os.environ)
    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:
        # a failed pull too: its module is loaded whenever one could have failed
        pull = sys.modules.get("radixserve.model.pull")
        if not isinstance(exc, ValueError) and not (pull and isinstance(exc, pull.PullError)):
            raise
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
