"""schemathesis against the server's own ``/openapi.json``: generated requests, valid and
not, never get a server error, and every response matches what the schema documents
(status codes, content types, bodies). Bounded: a fixed seed, a few dozen cases a route,
short generations."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from radixserve import Engine
from radixserve.server import create_app

from .test_server import _serve

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def server_url():
    engine = Engine("tiny", page_size=4, max_total_tokens=8192, check_invariants=True)
    srv, thread, url = _serve(create_app(engine, "tiny"))
    yield url
    srv.should_exit = True
    thread.join(timeout=10)


def short(case):
    """Short generations keep a few hundred cases within seconds: the point is what the
    server does with each request, not how long it can write."""
    body = case.body
    if isinstance(body, dict):
        for key in ("max_tokens", "max_new_tokens"):
            if isinstance(body.get(key), int) and body[key] > 8:
                body[key] = 8
        params = body.get("sampling_params")
        if isinstance(params, dict) and isinstance(params.get("max_new_tokens"), int):
            params["max_new_tokens"] = min(params["max_new_tokens"], 8)
    return case


def test_the_server_honours_its_own_schema(server_url):
    schema = schemathesis.openapi.from_url(server_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    calls = 0

    for operation in operations:
        # bodies that break the schema too, where there is a body to break
        modes = [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * bool(operation.body)
        for mode in modes:

            @fixed_seed(20261201)
            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
            @given(operation.as_strategy(mode))
            def check(case):
                nonlocal calls
                calls += 1
                short(case).call_and_validate(base_url=server_url, checks=CHECKS, timeout=60)

            check()
    assert calls >= 200
