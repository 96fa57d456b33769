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
from collections.abc import Sequence
from pathlib import Path

from radixserve.cpu.openmp import openmp_defaults
from radixserve.engine.config_flags import add_config_arguments

DESCRIPTION = (
    "An LLM serving engine whose radix-tree prefix cache computes a shared prefix's K/V "
    "once. Try `radixserve demo`, then `radixserve serve --model smollm2-135m-instruct`."
)
# name: (module, help)
COMMANDS = {
    "demo": ("radixserve.demo", "a chat workload served with the prefix cache on and off"),
    "simulate": ("radixserve.sim.simulate", "replay a trace: KV capacity, hit rate, eviction"),
}
BENCHES = {
    "cache": ("radixserve.bench.cache_bench", "match/insert/evict latency of the radix tree"),
    "model": ("radixserve.bench.model_bench", "forward throughput against transformers"),
    "kernels": ("radixserve.bench.kernel_bench", "native attention and matcher vs references"),
    "serve": ("radixserve.bench.http_load_bench", "a load check of the HTTP server over loopback"),
    "serving": ("radixserve.bench.workloads_bench", "the SGLang paper's workloads, side by side"),
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
    from radixserve.engine.config_flags import engine_options
    from radixserve.server import create_app

    keys = None
    if args.api_keys:
        keys = json.loads(Path(args.api_keys).read_text())
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise ValueError("--api-keys must name a JSON object mapping each key to a tenant")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = engine_options(args)  # every EngineConfig field but the model
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
    """The server's own flags; the engine's are ``EngineConfig``'s fields (``config_flags``)."""
    p.add_argument(
        "--served-model-name", default=None, help="the model's name in the API; none: --model"
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=30000, help="the port to listen on")
    p.add_argument("--api-keys", help="JSON file: {key: tenant namespace}")
    p.add_argument(
        "--replicas", type=int, default=None, help="engine replicas on Ray Serve ([cluster] extra)"
    )
    p.add_argument("--router", default="prefix", help="prefix, round-robin or power-of-two")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster; none: a local one")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds open requests may run on after SIGTERM before they are aborted",
    )
    add_config_arguments(p)


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
    serve = sub.add_parser(
        "serve",
        help="the OpenAI-compatible HTTP server",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
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
