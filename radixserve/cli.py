"""The ``radixserve`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _cache_demo(args: argparse.Namespace) -> int:
    from radixserve.bench.cache_demo import print_demo, run_demo
    from radixserve.bench.workloads import MultiTurnChat

    workload = MultiTurnChat(
        num_system_prompts=args.system_prompts,
        system_prompt_len=args.system_prompt_len,
        num_conversations=args.conversations,
        turns=args.turns,
        seed=args.seed,
    )
    result = run_demo(workload, args.page_size, args.capacity)
    print_demo(workload, args.page_size, result)
    return 0


def _bench_cache(args: argparse.Namespace) -> int:

    from radixserve.bench.cache_bench import CacheBenchConfig, num_steps, run_cache_bench
    from radixserve.bench.report import print_table, with_progress, write_json

    cfg = CacheBenchConfig(page_sizes=tuple(args.page_sizes), seed=args.seed)
    if args.quick:
        cfg = CacheBenchConfig(
            page_sizes=cfg.page_sizes,
            tree_sizes=(10_000,),
            hit_lens=(128, 1024),
            include_peer_shape=False,
            queries=50,
            rounds=1,
            evict_leaves=2000,
            evictions=200,
            seed=args.seed,
        )
    rows = with_progress("bench cache", num_steps(cfg), lambda step: run_cache_bench(cfg, step))
    columns = [
        ("page_size", "page"),
        ("tree_tokens", "cached tokens"),
        ("hit_len", "tokens/op"),
        ("op", "op"),
        ("p50_us", "p50 µs"),
        ("p99_us", "p99 µs"),
    ]
    print_table("radix tree latency (best of rounds)", rows, columns)
    if args.json:
        write_json(args.json, {"config": vars(cfg), "rows": rows})
    if args.plot:
        try:
            from radixserve.bench.plots import plot_cache_bench
        except ImportError:
            print("plotting needs matplotlib: pip install 'radixserve[bench]'", file=sys.stderr)
            return 1
        plot_cache_bench(rows, args.plot)
    return 0


def _bench_model(args: argparse.Namespace) -> int:
    import torch

    from radixserve.bench.model_bench import ModelBenchConfig, num_steps, run_model_bench
    from radixserve.bench.report import print_table, with_progress, write_json

    backend = args.attention_backend
    cfg = ModelBenchConfig(preset=args.model, dtypes=tuple(args.dtypes), attention_backend=backend)
    if args.quick:
        cfg = ModelBenchConfig(
            preset=args.model,
            dtypes=tuple(args.dtypes),
            attention_backend=backend,
            prefill_lens=(64,),
            decode_batches=(1, 4),
            context=64,
            decode_steps=2,
            reps=1,
        )
    rows = with_progress("bench model", num_steps(cfg), lambda step: run_model_bench(cfg, step))
    columns = [
        ("dtype", "dtype"),
        ("case", "case"),
        ("attention", "attention"),
        ("ours_tok_s", "radixserve tok/s"),
        ("transformers_tok_s", "transformers tok/s"),
        ("ratio", "ratio"),
    ]
    title = f"{cfg.preset}: forward throughput, {torch.get_num_threads()} threads"
    print_table(title, rows, columns)
    if args.json:
        write_json(args.json, {"config": vars(cfg), "rows": rows})
    return 0


def _bench_kernels(args: argparse.Namespace) -> int:
    from radixserve.bench.kernel_bench import KernelBenchConfig, num_steps, run_kernel_bench
    from radixserve.bench.report import print_table, with_progress, write_json
    from radixserve.csrc import native_available

    if not native_available():
        print("the native kernels could not be built (see the log above)", file=sys.stderr)
        return 1
    cfg = KernelBenchConfig(preset=args.model, dtypes=tuple(args.dtypes), reps=args.reps)
    if args.quick:
        cfg = KernelBenchConfig(
            preset=args.model,
            dtypes=tuple(args.dtypes),
            batches=(1, 4),
            contexts=(64, 600),
            extends=((2, 40, 24),),
            cascade_batch=4,
            cascade_prefix=300,
            cascade_suffix=8,
            linear_rows=(1, 5),
            linear_layers=2,
            matcher_tree_tokens=20_000,
            matcher_hit=1024,
            reps=1,
        )
    out = with_progress("bench kernels", num_steps(cfg), lambda step: run_kernel_bench(cfg, step))
    attention = out["rows"]
    print_table(
        f"attention, one layer of {cfg.preset}; copy {out['bandwidth_gb_s']:.1f} GB/s, "
        f"read {out['read_gb_s']:.1f} GB/s (medians)",
        attention,
        [
            ("kernel", "kernel"),
            ("dtype", "dtype"),
            ("case", "batch x context"),
            ("torch_ms", "torch ms"),
            ("plain_ms", "plain native ms"),
            ("native_ms", "native ms"),
            ("speedup", "speedup"),
            ("limit_ms", "copy limit ms"),
            ("of_limit", "x copy limit"),
            ("of_read_limit", "x read limit"),
            ("bandwidth_gb_s", "copy GB/s"),
            ("read_gb_s", "read GB/s"),
            ("gemm_ms", "dense GEMM ms"),
            ("gemm_ceiling", "plain / GEMM"),
        ],
    )
    print_table(
        f"linear layers of {cfg.preset} at a few rows (speedup: over torch's faster way)",
        out["linear"],
        [
            ("dtype", "dtype"),
            ("case", "case"),
            ("torch_ms", "F.linear ms"),
            ("weight_first_ms", "weight-first ms"),
            ("native_ms", "native ms"),
            ("speedup", "speedup"),
            ("gflop_s", "native GFLOP/s"),
            ("read_limit_ms", "read limit ms"),
            ("of_read_limit", "x read limit"),
        ],
    )
    print_table(
        "radix tree walk, p50 µs",
        out["matcher"],
        [
            ("case", "case"),
            ("python_walk_us", "Python walk"),
            ("native_walk_us", "with native scan"),
            ("cold_key_walk_us", "native, key cold"),
            ("match_prefix_us", "whole match_prefix"),
        ],
    )
    print_table(
        "targets",
        out["targets"],
        [("target", "target"), ("value", "value"), ("goal", "goal"), ("met", "met")],
    )
    if args.json:
        write_json(args.json, {"config": vars(cfg), **out})
    if args.plot:
        try:
            from radixserve.bench.plots import plot_kernel_bench
        except ImportError:
            print("plotting needs matplotlib: pip install 'radixserve[bench]'", file=sys.stderr)
            return 1
        plot_kernel_bench(attention, args.plot)
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from radixserve.bench.report import print_table, write_json
    from radixserve.bench.serve_bench import ServeBenchConfig, run_serve_bench

    cfg = ServeBenchConfig(
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        max_tokens=args.max_tokens,
        system_prompts=args.system_prompts,
        page_size=args.page_size,
        configs=tuple(args.configs),
        seed=args.seed,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task("bench serve", total=cfg.requests * len(cfg.configs))
        rows = run_serve_bench(cfg, lambda: progress.advance(task))
    columns = [
        ("config", "cache"),
        ("errors", "errors"),
        ("req_s", "req/s"),
        ("ttft_p50_ms", "TTFT p50 ms"),
        ("ttft_p99_ms", "TTFT p99 ms"),
        ("itl_p50_ms", "ITL p50 ms"),
        ("itl_p99_ms", "ITL p99 ms"),
        ("hit_rate", "hit rate"),
        ("speedup", "speedup"),
        ("invariants", "invariants"),
        ("shutdown", "SIGTERM"),
    ]
    rate = "all at once" if cfg.request_rate == float("inf") else f"{cfg.request_rate:g} req/s"
    title = (
        f"{cfg.model} over HTTP: {cfg.requests} streamed chats, {cfg.system_prompts} shared "
        f"system prompts, {cfg.concurrency} concurrent, {rate}, {cfg.max_tokens} tokens each"
    )
    print_table(title, rows, columns)
    if args.json:
        write_json(args.json, {"config": vars(cfg), "rows": rows})
    failed = [
        r for r in rows if r["errors"] or r["invariants"] != "ok" or r["shutdown"] != "graceful"
    ]
    for r in failed:
        why = r["first_error"] or f"invariants {r['invariants']}, shutdown {r['shutdown']}"
        print(f"{r['config']}: failed: {why}", file=sys.stderr)
    return 1 if failed else 0


def _bench_lang(args: argparse.Namespace) -> int:

    from radixserve.bench.lang_bench import PROGRAMS, LangBenchConfig, run_lang_bench
    from radixserve.bench.report import print_table, with_progress, write_json

    cfg = LangBenchConfig(model=args.model, rounds=args.rounds, seed=args.seed)
    if args.quick:
        cfg = LangBenchConfig(
            model=args.model,
            few_shot_questions=12,
            tot_programs=2,
            tot_width=2,
            max_tokens=4,
            rounds=1,
            seed=args.seed,
        )
    programs = list(PROGRAMS) if args.programs == ["all"] else args.programs
    if unknown := set(programs) - set(PROGRAMS):
        raise ValueError(f"unknown programs {sorted(unknown)}; choose from {sorted(PROGRAMS)}")
    rows = with_progress(
        "bench lang",
        len(programs) * 2 * cfg.rounds,
        lambda step: run_lang_bench(cfg, programs, step),
    )
    columns = [
        ("program", "program"),
        ("cache", "cache"),
        ("programs", "programs"),
        ("calls", "calls"),
        ("prompt_tokens", "prompt tokens"),
        ("programs_s", "programs/s"),
        ("speedup", "speedup"),
        ("hit_rate", "hit rate"),
        ("optimal_hit_rate", "optimal"),
        ("of_optimal", "of optimal"),
    ]
    print_table(f"{cfg.model}: DSL programs with run_batch", rows, columns)
    if args.json:
        write_json(args.json, {"config": vars(cfg), "rows": rows})
    return 0


def _bench_serving(args: argparse.Namespace) -> int:

    from radixserve.bench.report import print_table, with_progress, write_json
    from radixserve.bench.serving_bench import (
        ServingBenchConfig,
        check_targets,
        num_steps,
        run_serving_bench,
    )
    from radixserve.bench.workloads import SERVING_WORKLOADS

    workloads = tuple(SERVING_WORKLOADS) if args.workload == ["all"] else tuple(args.workload)
    cfg = ServingBenchConfig(
        model=args.model,
        workloads=workloads,
        configs=tuple(args.configs),
        scale=args.scale,
        max_tokens=args.max_tokens,
        page_size=args.page_size,
        rounds=args.rounds,
        seed=args.seed,
        sweep_workloads=tuple(args.sweep or ()),
        vllm_python=args.vllm_python,
    )
    result = with_progress(
        "bench serving", num_steps(cfg), lambda step: run_serving_bench(cfg, step)
    )
    columns = [
        ("workload", "workload"),
        ("config", "config"),
        ("req_s", "req/s"),
        ("tok_s", "tok/s"),
        ("ttft_p50_s", "TTFT p50 s"),
        ("ttft_p99_s", "TTFT p99 s"),
        ("hit_rate", "hit rate"),
        ("of_optimal", "of optimal"),
        ("prefill_tokens", "prefilled"),
        ("dedup_ratio", "dedup"),
        ("lookup_p50_us", "lookup p50 µs"),
        ("sched_ms_per_step", "sched ms/step"),
        ("speedup_vs_off", "vs off"),
    ]
    print_table(
        f"{cfg.model}: serving workloads, page size {cfg.page_size}", result["rows"], columns
    )
    if result["sweep"]:
        sweep_cols = [
            ("workload", "workload"),
            ("kv_tokens", "KV tokens"),
            ("config", "config"),
            ("hit_rate", "hit rate"),
            ("req_s", "req/s"),
        ]
        print_table("KV-pool sweep", result["sweep"], sweep_cols)
    targets = check_targets(result["rows"], result["sweep"])
    target_cols = [
        ("target", "target"),
        ("workload", "workload"),
        ("measured", "measured"),
        ("goal", "goal"),
        ("met", "met"),
        ("rounds", "paired rounds"),
    ]
    print_table("targets", targets, target_cols)
    if args.json:
        write_json(args.json, {"config": vars(cfg), **result, "targets": targets})
    if args.plot:
        try:
            from radixserve.bench.plots import plot_serving_bench

            plot_serving_bench(result["rows"], result["sweep"], args.plot)
        except ImportError:
            print("plotting needs matplotlib: pip install 'radixserve[bench]'", file=sys.stderr)
            return 1
    return 0


def _bench_report(args: argparse.Namespace) -> int:
    from radixserve.bench.docs_report import write_report

    print(f"wrote {write_report(args.docs)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from radixserve.bench.demo import DemoWorkload, print_results, run_demo

    work = DemoWorkload(users=args.users, turns=args.turns, max_new_tokens=args.max_new_tokens)
    options = dict(
        page_size=args.page_size,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
    )
    results = run_demo(args.model, work, **options)
    print_results(args.model, work, results, where=f"{args.device}, {args.dtype}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import json
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
    engine = Engine(
        args.model,
        page_size=args.page_size,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        schedule_policy=args.schedule_policy,
        chunked_prefill_size=args.chunked_prefill_size,
        enable_prefix_cache=not args.disable_prefix_cache,
        cache_index=args.cache_index,
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
    )
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


def _export_preset(args: argparse.Namespace) -> int:
    from radixserve.model.presets import export_preset

    out = export_preset(args.name, args.directory)
    print(f"wrote preset {args.name!r} to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    full = sub.add_parser("demo", help="a chat workload served with the prefix cache on and off")
    full.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    full.add_argument("--users", type=int, default=12)
    full.add_argument("--turns", type=int, default=2)
    full.add_argument("--max-new-tokens", type=int, default=16)
    full.add_argument("--page-size", type=int, default=16)
    full.add_argument("--device", default="cpu", help="cpu or cuda")
    full.add_argument("--dtype", default="float32")
    full.add_argument("--attention-backend", default="auto")
    full.set_defaults(func=_demo)

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    serve.add_argument("--model", default="tiny", help="a preset or a HF directory")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--api-keys", help="JSON file: {key: tenant namespace}")
    serve.add_argument("--page-size", type=int, default=16)
    serve.add_argument("--max-total-tokens", type=int, default=None)
    serve.add_argument("--max-running-requests", type=int, default=64)
    serve.add_argument("--schedule-policy", default="lpm")
    serve.add_argument("--chunked-prefill-size", type=int, default=2048)
    serve.add_argument("--disable-prefix-cache", action="store_true")
    serve.add_argument("--cache-index", default="radix", help="radix or block-hash")
    serve.add_argument("--attention-backend", default="auto")
    serve.add_argument("--dtype", default="float32")
    serve.add_argument("--device", default="cpu")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds open requests may run on after SIGTERM before they are aborted",
    )
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("cache-demo", help="a multi-turn chat workload through the tree")
    demo.add_argument("--page-size", type=int, default=16)
    demo.add_argument("--system-prompts", type=int, default=4)
    demo.add_argument("--system-prompt-len", type=int, default=1024)
    demo.add_argument("--conversations", type=int, default=64)
    demo.add_argument("--turns", type=int, default=4)
    demo.add_argument("--capacity", type=int, default=None, help="KV slots (default: all)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cache_demo)

    export = sub.add_parser("export-preset", help="write a built-in model as a HF directory")
    export.add_argument("name", help="tiny or bench-135m")
    export.add_argument("directory")
    export.set_defaults(func=_export_preset)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    cache = bench.add_parser("cache", help="match/insert/evict latency of the radix tree")
    cache.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    cache.add_argument("--quick", action="store_true", help="a small grid, for smoke tests")
    cache.add_argument("--json", help="write the rows to this file")
    cache.add_argument("--plot", help="write a PNG chart to this file")
    cache.add_argument("--seed", type=int, default=0)
    cache.set_defaults(func=_bench_cache)
    model = bench.add_parser("model", help="forward throughput against transformers")
    model.add_argument("--model", default="bench-135m", help="a preset")
    model.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    model.add_argument("--attention-backend", default="auto", help="auto, torch or native")
    model.add_argument("--quick", action="store_true", help="small shapes, for smoke tests")
    model.add_argument("--json", help="write the rows to this file")
    model.set_defaults(func=_bench_model)
    kernels = bench.add_parser("kernels", help="native attention and matcher vs references")
    kernels.add_argument("--model", default="bench-135m", help="a preset (for its shapes)")
    kernels.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    kernels.add_argument("--reps", type=int, default=5)
    kernels.add_argument("--quick", action="store_true", help="small shapes, for smoke tests")
    kernels.add_argument("--json", help="write the rows to this file")
    kernels.add_argument("--plot", help="write a PNG chart to this file")
    kernels.set_defaults(func=_bench_kernels)
    load = bench.add_parser("serve", help="a load check of the HTTP server over loopback")
    load.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    load.add_argument("--requests", type=int, default=128)
    load.add_argument("--concurrency", type=int, default=64)
    load.add_argument(
        "--request-rate", type=float, default=float("inf"), help="req/s (default: all at once)"
    )
    load.add_argument("--max-tokens", type=int, default=16)
    load.add_argument("--system-prompts", type=int, default=4)
    load.add_argument("--page-size", type=int, default=16)
    load.add_argument("--configs", nargs="+", default=["radix", "off"], help="radix and/or off")
    load.add_argument("--json", help="write the rows to this file")
    load.add_argument("--seed", type=int, default=0)
    load.set_defaults(func=_bench_serve)
    serving = bench.add_parser("serving", help="the SGLang paper's workloads, side by side")
    serving.add_argument("--workload", nargs="+", default=["all"], help="names, or all")
    serving.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    serving.add_argument(
        "--configs",
        nargs="+",
        default=["radix-lpm", "radix-fcfs", "block-hash-fcfs", "off", "transformers"],
        help="radix-lpm radix-fcfs block-hash-fcfs off transformers vllm radix-lpm-torch "
        "radix-lpm-twin",
    )
    serving.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    serving.add_argument("--max-tokens", type=int, default=8)
    serving.add_argument("--page-size", type=int, default=16)
    serving.add_argument("--rounds", type=int, default=1)
    serving.add_argument(
        "--sweep", nargs="+", help="also sweep the KV-pool size on these workloads"
    )
    serving.add_argument("--vllm-python", help="python of a venv with vllm, for the vllm config")
    serving.add_argument("--json", help="write rows, sweep and targets to this file")
    serving.add_argument("--plot", help="write a PNG chart to this file")
    serving.add_argument("--seed", type=int, default=0)
    serving.set_defaults(func=_bench_serving)
    report = bench.add_parser("report", help="regenerate docs/benchmarks.md from the JSON")
    report.add_argument("--docs", default="docs", help="the folder with bench_*.json and notes/")
    report.set_defaults(func=_bench_report)
    lang = bench.add_parser("lang", help="DSL programs, prefix cache on and off")
    lang.add_argument("--model", default="bench-135m", help="a preset or a HF directory")
    lang.add_argument("--programs", nargs="+", default=["all"], help="few-shot, tree-of-thought")
    lang.add_argument("--rounds", type=int, default=1)
    lang.add_argument("--quick", action="store_true", help="small batches, for smoke tests")
    lang.add_argument("--json", help="write the rows to this file")
    lang.add_argument("--seed", type=int, default=0)
    lang.set_defaults(func=_bench_lang)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
