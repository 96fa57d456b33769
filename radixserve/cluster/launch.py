"""``radixserve serve --replicas N``: Ray (a local one, or a cluster's), Serve's HTTP proxy
on ``--host``/``--port``, the application, then wait for SIGINT/SIGTERM and take down what
was started (the application, then a local Ray with Serve in it; only the application on
a cluster that was joined)."""

from __future__ import annotations

import logging
import os
import signal
import threading

logger = logging.getLogger("radixserve.cluster")
APP_NAME = "radixserve"


def serve_cluster(spec_args: dict, host: str, port: int, ray_address: str | None) -> int:
    import ray
    from ray import serve

    from radixserve.cluster.app import NAMESPACE, ClusterSpec, build_app

    local = ray_address is None
    if local:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, namespace=NAMESPACE)
    else:
        ray.init(address=ray_address, namespace=NAMESPACE)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        spec = ClusterSpec(cpus_per_replica=max(0.5, cpus / spec_args["replicas"]), **spec_args)
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(spec), name=APP_NAME, route_prefix="/")
        logger.info("serving %d replicas on http://%s:%d", spec.replicas, host, port)
        print(f"radixserve: {spec.replicas} replicas on http://{host}:{port}", flush=True)
        stop.wait()
    finally:
        serve.delete(APP_NAME)  # replicas stop gracefully: engines shut down
        if local:
            ray.shutdown()  # Serve's controller and proxy go with the local Ray
    return 0
