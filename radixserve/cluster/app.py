"""The Serve application: an ``ingress`` deployment (the OpenAI and native routes, and
``/cluster``) in front of an ``engine`` deployment of N replicas, one ``Engine`` each,
routed by a ``router.py`` router that reads the replicas' routing stats every second."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from radixserve.cluster.client import ClusterEngine
from radixserve.cluster.directory import Directory
from radixserve.cluster.replica import EngineReplica
from radixserve.cluster.router import PowerOfTwoRouter, PrefixRouter, RoundRobinRouter
from radixserve.cpu.openmp import OPENMP_ENV, openmp_defaults
from radixserve.engine.config import EngineConfig
from radixserve.model.loader import load_model_config, load_tokenizer
from radixserve.server.app import create_app

ROUTERS = {
    "prefix": PrefixRouter,
    "round-robin": RoundRobinRouter,
    "power-of-two": PowerOfTwoRouter,
}
NAMESPACE = "radixserve"  # the Ray namespace the directory actor lives in
STATS_PERIOD_S = 1.0
_directories: dict[str, object] = {}  # handles keep the directory actors alive


@dataclass(frozen=True)
class ClusterSpec:
    model: str
    replicas: int = 2
    router: str = "prefix"
    engine_options: dict = field(default_factory=dict)  # EngineConfig fields but the model
    served_model_name: str | None = None
    api_keys: dict[str, str] | None = None
    router_options: dict = field(default_factory=dict)  # PrefixRouter.initialize_state's
    cpus_per_replica: float = 1.0
    directory: str = "radixserve-directory"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; choose one of {sorted(ROUTERS)}")
        EngineConfig(model=self.model, **self.engine_options)  # fails here, not in a replica


@serve.ingress()
class Ingress:
    def __init__(self, engine, spec: ClusterSpec) -> None:
        self.spec = spec
        shape = load_model_config(spec.model)
        self.cluster = ClusterEngine(
            engine,
            EngineConfig(model=spec.model, **spec.engine_options),
            load_tokenizer(spec.model),
            shape.vocab_size,
            shape.context_len,
            ray.get_actor(spec.directory, namespace=NAMESPACE),
        )

    def __serve_build_asgi_app__(self):
        app = create_app(
            self.cluster, self.spec.served_model_name or self.spec.model, self.spec.api_keys
        )
        app.add_api_route("/cluster", self.cluster_info, methods=["GET"])
        return app

    async def cluster_info(self) -> dict:
        """The replicas, their load, hit rates and digest sizes."""
        import asyncio

        replicas = await asyncio.to_thread(self.cluster.replicas)
        keys = (
            "running",
            "waiting",
            "queued_tokens",
            "queried_tokens",
            "hit_tokens",
            "token_hit_rate",
            "kv_usage",
            "digest_keys",
            "digest_stride",
        )
        return {
            "router": self.spec.router,
            "replicas": [
                {"replica": r} | {k: s.get(k) for k in keys} for r, s in sorted(replicas.items())
            ],
        }


def build_app(spec: ClusterSpec):
    """The application to ``serve.run``; creates the directory actor (owned by the caller's
    process, so it goes when that does)."""
    try:  # one per Ray session: an earlier build's, or a new one (its handle kept: it owns it)
        ray.get_actor(spec.directory, namespace=NAMESPACE)
    except ValueError:
        _directories[spec.directory] = Directory.options(
            name=spec.directory, namespace=NAMESPACE
        ).remote()
    config = EngineConfig(model=spec.model, **spec.engine_options)
    router = RequestRouterConfig(
        request_router_class=ROUTERS[spec.router],
        request_router_kwargs={
            "page_size": config.page_size,
            "fingerprint": config.routing_fingerprint,
            **spec.router_options,
        },
        request_routing_stats_period_s=STATS_PERIOD_S,
        request_routing_stats_timeout_s=10 * STATS_PERIOD_S,
    )
    threads = max(1, int(spec.cpus_per_replica))
    # a replica's process loads libgomp with the driver's OpenMP waiting (cpu/openmp.py)
    env = {"OMP_NUM_THREADS": str(threads)} | {
        k: v for k, v in os.environ.items() if k in OPENMP_ENV
    }
    openmp_defaults(env)
    engine = serve.deployment(
        EngineReplica,
        name="engine",
        num_replicas=spec.replicas,
        max_ongoing_requests=1024,  # the engine batches; Serve need not queue for it
        ray_actor_options={
            "num_cpus": spec.cpus_per_replica,
            "runtime_env": {"env_vars": env},
        },
        request_router_config=router,
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
    )
    ingress = serve.deployment(
        Ingress, name="ingress", max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0}
    )
    options = spec.engine_options
    return ingress.bind(engine.bind(spec.model, options, spec.directory, NAMESPACE), spec)
