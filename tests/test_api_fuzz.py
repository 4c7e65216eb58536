"""No request, however malformed, produces a 500 — across every route the API has.

Two halves:
- schema fuzzing: schemathesis generates requests for every operation in the live OpenAPI
  schema (valid and schema-violating ones), sent with a school-wide key and a stack-bound key,
  aimed both at real objects (so requests get past the 404s) and at generated identifiers;
- hostile cases beyond the schema, for every route Django resolves (new routes are covered
  automatically): broken and non-object JSON, deep nesting, huge strings and numbers, NUL and
  control characters, wrong content types and charsets, hostile path segments, bogus
  pagination, and missing/garbage credentials.

Every response must be < 500 with no stack trace; on API routes every 4xx must be JSON in the
error contract ({"error": {"code", "message", "fields"}, "detail"}) and must have stored nothing.
The run is deterministic (derandomized Hypothesis, no example database) and bounded (a fixed
number of examples per operation). A failure lists every offending request with the last lines
of the server's traceback.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET

from memories.models import Memory
from stacks.models import Stack
from tests.fuzz.harness import (
    DOC_ROUTES,
    Outcome,
    Route,
    Sent,
    World,
    all_routes,
    build_url,
    build_world,
    check,
    encode_path_value,
    traceback_catcher,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # slow: hundreds of generated requests

# Examples per operation and mode. Small on purpose: the hostile half covers the known-nasty
# shapes exhaustively; this half explores what nobody thought of. Raise locally to dig deeper.
FULL = bool(os.environ.get("FUZZ_FULL"))  # every case on every route, more examples: for local digging
EXAMPLES = ({"school_valid_ids": 10, "school_negative": 10, "school_generated_ids": 5, "bound": 6} if FULL else
            {"school_valid_ids": 3, "school_negative": 3, "school_generated_ids": 1, "bound": 2})
if os.environ.get("FUZZ_EXAMPLES"):  # e.g. FUZZ_EXAMPLES=50: every plan draws that many, for a deep local run
    EXAMPLES = dict.fromkeys(EXAMPLES, int(os.environ["FUZZ_EXAMPLES"]))


def _openapi() -> dict[str, Any]:
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document, renderer_context={}))


OPENAPI = _openapi()
SCHEMA = schemathesis.openapi.from_dict(OPENAPI)
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}  # type: ignore[union-attr]
ROUTES = all_routes()


# 500s whose fix belongs in a file outside this test's remit: (path prefix of the request,
# text in the failure, where the fix goes). Each is still reported — as an xfail carrying the
# reproducer, never skipped — and the test passes by itself once the fix lands. Anything else
# fails the test.
KNOWN_OPEN: list[tuple[str, tuple[str, ...], str]] = [
]


def _known(failure: str) -> str | None:
    request_line = failure.split("\n", 1)[0]
    target = request_line.split(" ", 1)[-1]
    for prefix, signatures, where in KNOWN_OPEN:
        if target.startswith(prefix) and all(signature in failure for signature in signatures):
            return where
    return None


def _finish(outcome: Outcome, what: str) -> None:
    if not outcome.failures:
        return
    unknown = [f for f in outcome.failures if _known(f) is None]
    failures = unknown or outcome.failures
    shown = failures[:25]
    more = f"\n... and {len(failures) - len(shown)} more" if len(failures) > len(shown) else ""
    report = (f"{len(failures)} of {outcome.requests} requests to {what} broke the error standard:\n  "
              + "\n  ".join(shown) + more)
    if unknown:
        pytest.fail(report, pytrace=False)
    pytest.xfail("known open, fix outside tests: " + "; ".join(sorted({str(_known(f)) for f in failures}))
                 + "\n" + report)


@pytest.fixture
def world() -> World:
    return build_world()


# --- schema fuzzing ------------------------------------------------------------------------------

def _documented_types(operation: Any) -> tuple[str, ...]:
    method = OPENAPI["paths"][operation.path][operation.method.lower()]
    types: set[str] = set()
    for response in method.get("responses", {}).values():
        types.update(str(t).lower() for t in response.get("content", {}))
    return tuple(types)


def _sent_from_case(case: Any, secret: str | None) -> Sent:
    params = {name: encode_path_value(str(value)) for name, value in (case.path_parameters or {}).items()}
    path = case.path
    for name, value in params.items():
        path = path.replace("{" + name + "}", value)
    headers = {str(k): str(v) for k, v in (case.headers or {}).items()
               if str(k).lower() not in ("authorization", "content-type", "content-length", "host")}
    if secret is not None:
        headers["authorization"] = f"Bearer {secret}"
    body = b""
    content_type: str | None = None
    if case.body is not NOT_SET:
        content_type = case.media_type or "application/json"
        body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    return Sent(method=case.method.upper(), url=build_url(path, case.query), headers=headers,
                content_type=content_type, body=body)


def _run_strategy(strategy: Any, examples: int, each: Callable[[Any], None]) -> None:
    """Draw `examples` cases deterministically and hand each to `each`; never shrinks because
    `each` records failures instead of raising (one run reports all of them)."""

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=strategy)
    def run(case: Any) -> None:
        each(case)

    run()


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_generated_requests_never_500(label: str, world: World) -> None:
    operation = OPERATIONS[label]
    documented = _documented_types(operation)
    known_ids = {name: world.path_values[name] for name in world.path_values
                 if "{" + name + "}" in operation.path}
    outcome = Outcome()
    plans = [
        ("school_valid_ids", GenerationMode.POSITIVE, known_ids, world.school_secret),
        ("school_negative", GenerationMode.NEGATIVE, known_ids, world.school_secret),
        ("school_generated_ids", GenerationMode.POSITIVE, None, world.school_secret),
        ("bound", GenerationMode.NEGATIVE, known_ids, world.bound_secret),
    ]
    with traceback_catcher() as catcher:
        for plan, mode, ids, secret in plans:
            if plan == "school_generated_ids" and not known_ids:
                continue
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=ids or None)

            def each(case: Any, secret: str = secret) -> None:
                check(_sent_from_case(case, secret), catcher, outcome, api_route=True, documented_types=documented)

            try:
                _run_strategy(strategy, EXAMPLES[plan], each)
            except schemathesis.errors.SerializationNotPossible:
                continue  # negative mode found nothing it can send for this operation
    if os.environ.get("FUZZ_STATS"):
        print(f"\n{label}: {outcome.requests} requests, statuses {dict(sorted(outcome.statuses.items()))}")
    _finish(outcome, label)


# --- hostile cases beyond the schema -------------------------------------------------------------

DEEP = 5000
# Shapes every body-taking view must refuse on its own: not an object, or not JSON at all.
SHAPE_BODIES: list[tuple[bytes, str]] = [
    (b'{"kind": "note", "content": ', "application/json"),
    (b"", "application/json"),
    (b'[{"kind": "note"}]', "application/json"),
    (b"42", "application/json"),
    (b'"hello"', "application/json"),
    (b"null", "application/json"),
    (b'{"kind": "note", "content": "\\ud800", "text": "\\udfff"}', "application/json"),
    (b'{"kind": "note", "content": "x", "confidence": NaN, "strength": Infinity, "limit": 1e999}',
     "application/json"),
]
# Cases decided by the shared parser and content negotiation: a rotating share per route.
PARSER_BODIES: list[tuple[bytes, str]] = [
    (b"[" * DEEP + b"]" * DEEP, "application/json"),
    (b'{"a":' * DEEP + b"1" + b"}" * DEEP, "application/json"),
    (b'{"kind": "note", "content": "\xff\xfe"}', "application/json"),
    (b'{"kind": "note", "content": "x"}', "text/plain"),
    (b"kind=note&content=x", "application/x-www-form-urlencoded"),
    (b"--x\r\n\r\n", "multipart/form-data"),
    (b'{"kind": "note", "content": "x"}', "application/json; charset=utf-77"),
    ('{"kind": "note"}'.encode("utf-16"), "application/json; charset=utf-16"),
    (b"<memory/>", "application/xml"),
]
ODD_METHODS = ["PUT", "DELETE", "OPTIONS", "HEAD", "PROPFIND", "TRACE"]


def _field_names(route: Route) -> list[str]:
    """Body fields the schema documents for this route (any method), plus common ones."""
    names = {"kind", "content", "text", "name", "stack_id", "email", "display_name", "value", "items",
             "memories", "operations", "query", "limit", "cursor", "since", "tags", "record_id", "reason"}
    for method in OPENAPI["paths"].get(_openapi_path(route), {}).values():
        if not isinstance(method, dict):
            continue
        content = method.get("requestBody", {}).get("content", {})
        for media in content.values():
            names.update(_schema_properties(media.get("schema", {})))
    return sorted(names)


def _schema_properties(schema: dict[str, Any]) -> set[str]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = OPENAPI.get("components", {}).get("schemas", {}).get(name, {})
    return set(schema.get("properties", {}))


def _bodies_from_fields(fields: list[str]) -> list[tuple[bytes, str]]:
    """Every known field at once set to one nasty value: the shape validation must catch."""
    nasty: list[tuple[str, Any]] = [
        ("NUL bytes", "a\x00b"),
        ("control characters", "\x01\x02\x1b[31m\x7f\u202e"),
        ("lone surrogate", "\ud800"),
        ("huge string (1 MB)", "x" * 1_000_000),
        ("huge integer", 10**40),
        ("negative integer", -(2**63)),
        ("wrong types (object)", {"nested": {"deeper": [1, None, True]}}),
    ]
    bodies = []
    for label, value in nasty:
        payload = dict.fromkeys(fields, value)
        payload["kind"] = "note" if label != "NUL bytes" else "note\x00"
        bodies.append((json.dumps(payload).encode(), "application/json"))
    return bodies


HOSTILE_SEGMENTS = [
    "a%00b", "%2e%2e", "..%2f..%2fetc%2fpasswd", "%ff%fe", "%e2%80%ae%f0%9f%92%a9", "%0a%0d%09",
    "x" * 5000, "99999999999999999999999999", "%25", "usr_%27%3B--",
]

_cursor = base64.b64encode
HOSTILE_QUERIES: list[list[tuple[str, str]]] = [
    [("limit", "-1")], [("limit", "10" * 20)], [("limit", "abc\x00")],
    [("cursor", "garbage")], [("cursor", "\x00")],
    [("cursor", _cursor(b"p=not-a-date").decode())],
    [("cursor", _cursor(b"p=2026-13-45T99:99:99").decode())],
    [("cursor", _cursor(b"o=-5&r=7&p=x").decode())],
    [("cursor", _cursor(b"o=99999999999999999999&p=2026-01-01").decode())],
    [("cursor", _cursor(b"p=\x00").decode())],
    [("since", "not-a-date"), ("until", "\x00"), ("created_after", "9999-99-99"), ("created_before", "-1")],
    [("kind", "\x00"), ("tags", "\x00"), ("forgotten", "\x00"), ("q", "\x00"), ("query", "\x00")],
    [("kind", "x" * 10000), ("tags", ",,,,"), ("q", "x" * 10000)],
    [("budget", "-1"), ("max_items", "99999999999999999999"), ("min_score", "nan"), ("k", "inf")],
]

GARBAGE_AUTH = [
    None,
    "Bearer",
    "Bearer ",
    "Bearer knl_sk_",
    "Bearer knl_sk_" + "x" * 10000,
    "Bearer knl_sk_\x00\x01",
    "Bearer a.b.c",
    "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.",
    "Bearer eyJ" + "A" * 2000,
    "Basic Zm9vOmJhcg==",
    "Token knl_sk_abc",
    "Bearer knl_sk_\xe9\xff",
    "bearer  knl_sk_abc  extra",
]


def _concrete_paths(route: Route, world: World) -> dict[str, str]:
    """Path for the real objects, plus a generated value for anything the world lacks."""
    values = {}
    for name, converter in route.params:
        value = world.path_values.get(name, "fuzz-" + name)
        values[name] = encode_path_value(value)
        if converter == "uuid" and name not in world.path_values:
            values[name] = "00000000-0000-4000-8000-000000000000"
    return values


def _route_id(route: Route) -> str:
    return route.pattern or "/"


def _rotation(cases: list[Any], index: int, share: int) -> list[Any]:
    """This route's deterministic share of the cases that exercise shared machinery (the
    authentication classes, the JSON parser, content negotiation): every case runs against
    many routes and every route sees some, without paying routes x cases requests in CI."""
    if FULL:
        return cases
    return [case for i, case in enumerate(cases) if (i + index) % share == 0]


@pytest.mark.parametrize("route", ROUTES, ids=_route_id)
def test_hostile_requests_never_500(route: Route, world: World) -> None:
    index = ROUTES.index(route)
    outcome = Outcome()
    base_values = _concrete_paths(route, world)
    path = route.fill(base_values)
    auth = {"authorization": f"Bearer {world.school_secret}"}
    documented = _route_documented_types(route)
    first = route.methods[0]
    json_body = {"body": b"{}", "content_type": "application/json"}

    with traceback_catcher() as catcher:
        def hit(method: str, url: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
                content_type: str | None = None) -> None:
            check(Sent(method, url, headers if headers is not None else auth, content_type, body), catcher,
                  outcome, api_route=route.api, documented_types=documented)

        def empty_body(method: str) -> dict[str, Any]:
            return json_body if method in ("POST", "PUT", "PATCH") else {}

        # Bodies, through this route's own view code: every shape and every nasty field value.
        for method in route.methods:
            if method in ("POST", "PUT", "PATCH"):
                for body, content_type in (SHAPE_BODIES + _rotation(PARSER_BODIES, index, 3)
                                           + _bodies_from_fields(_field_names(route))):
                    hit(method, path, body=body, content_type=content_type)

        # Path segments: each parameter in turn, the others real; and a stack of another school.
        for name, _ in route.params:
            for segment in HOSTILE_SEGMENTS:
                hit(first, route.fill({**base_values, name: segment}), **empty_body(first))
        if any(name == "stack" for name, _ in route.params):
            elsewhere = route.fill({**base_values, "stack": world.other_org_stack})
            hit(first, elsewhere, **empty_body(first))
            # DRF's ?format= override picks the renderer; the error must still be the JSON contract.
            hit(first, build_url(elsewhere, {"format": "md"}), **empty_body(first))

        # Query strings on reads: pagination and filters.
        if "GET" in route.methods and route.pattern not in DOC_ROUTES:  # each renders the whole document
            for query in HOSTILE_QUERIES:
                hit("GET", build_url(path, query))

        # Credentials: none, a share of the garbage, and the stack-bound key on every method.
        hit(first, path, headers={}, **empty_body(first))
        for value in _rotation(GARBAGE_AUTH, index, 4):
            hit(first, path, headers={"authorization": value}, **empty_body(first))
        for method in route.methods:
            hit(method, path, headers={"authorization": f"Bearer {world.bound_secret}"}, **empty_body(method))

        # Methods nobody routes, and a hostile Accept header.
        for method in _rotation(ODD_METHODS, index, 3):
            hit(method, path)
        hit(first, path, headers={**auth, "accept": "application/x-nonsense, */*;q=bogus"}, **empty_body(first))

    _finish(outcome, "/" + route.pattern)


def _route_documented_types(route: Route) -> tuple[str, ...]:
    openapi_path = _openapi_path(route)
    types: set[str] = set()
    for method in OPENAPI["paths"].get(openapi_path, {}).values():
        if isinstance(method, dict):
            for response in method.get("responses", {}).values():
                types.update(str(t).lower() for t in response.get("content", {}))
    return tuple(types)


def _openapi_path(route: Route) -> str:
    openapi_path = "/" + route.pattern
    for name, _ in route.params:
        for converter in ("str", "uuid", "int", "slug", "path"):
            openapi_path = openapi_path.replace(f"<{converter}:{name}>", "{" + name + "}")
    return openapi_path


# --- regressions for the 500s this suite found and memoryhub/errors.py now maps ---------------

def test_tampered_cursor_is_400(world: World) -> None:
    """A cursor is opaque base64 of `p=<position>`; a position that is not a timestamp used to
    reach the ORM and 500. Every cursor-paginated list shares the path; stacks is one of them."""
    client = Client()
    cursor = base64.b64encode(b"p=not-a-date").decode()
    response = client.get(f"/api/v1/stacks/?cursor={cursor}",
                          headers={"authorization": f"Bearer {world.school_secret}"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_deeply_nested_json_is_400_and_stores_nothing(world: World) -> None:
    before = Stack.objects.count()
    body = b'{"stack_id": "deep", "display_name":' + b"[" * DEEP + b"]" * DEEP + b"}"
    response = Client().post("/api/v1/stacks/", data=body, content_type="application/json",
                             headers={"authorization": f"Bearer {world.school_secret}"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The JSON body is nested too deeply."
    assert Stack.objects.count() == before


def test_lone_surrogate_is_400_and_stores_nothing(world: World) -> None:
    """JSON may spell a lone UTF-16 surrogate; the memory text normalizer used to 500 encoding it."""
    before = Memory.objects.count()
    response = Client().post(f"/api/v1/stacks/{world.path_values['stack']}/memories",
                             data=b'{"kind": "note", "content": "a\\ud800"}', content_type="application/json",
                             headers={"authorization": f"Bearer {world.school_secret}"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert Memory.objects.count() == before


def test_nul_in_bearer_key_is_401_not_a_database_error() -> None:
    for header in ("Bearer knl_sk_\x00\x01", "Bearer knl_sk_abc\x00"):
        response = Client().get("/api/v1/stacks/", headers={"authorization": header})
        assert response.status_code == 401, (header, response.content)
        assert response.json()["error"]["code"] == "malformed_authorization"


def test_every_route_is_fuzzed() -> None:
    """The route enumeration sees the routes it must; guards against silently testing nothing."""
    patterns = {route.pattern for route in ROUTES}
    assert {"auth/register", "api/v1/stacks/", "api/v1/keys/<str:key_id>/"} <= patterns
    assert len(OPERATIONS) >= 20
