"""The machinery behind tests/test_api_fuzz.py: a small real world to aim requests at, one way to
send a request in-process, and the checks every response must pass.

Requests go through Django's test client (the full middleware stack and URL resolver, in the
test's database transaction); nothing is mocked. A failure is recorded with the request that
caused it and the last lines of the server-side traceback, so the report is a reproducer.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from accounts.models import ApiKey, Membership, User
from accounts.throttles import throttle_state_clear
from memories.models import BootConfigEntry, Checkpoint, Memory
from stacks.models import Stack, TeacherAssignment
from tests.factories import make_key, make_org, make_stack, make_user, sql_rows

# Routes outside the product API: Django's admin (its own app, HTML) and the readiness probe,
# whose 503 without a Celery worker is its documented contract, not an error.
EXCLUDED_PREFIXES = ("admin/", "readyz")

# Documentation views (HTML, OpenAPI YAML): the JSON error contract does not apply to them, the
# no-500 rule does.
DOC_ROUTES = ("api/schema/", "api/docs/")

MAX_BODY_IN_REPORT = 300


@dataclass
class World:
    """One school with two stacks, a school-wide key, a key bound to one stack, and one real
    object of each kind a path can name, so generated requests reach past the 404s."""

    school_secret: str
    bound_secret: str
    path_values: dict[str, str]
    other_org_stack: str


def build_world() -> World:
    org = make_org()
    admin = make_user(org, role=Membership.Role.ADMIN)
    stack = make_stack(org, "fuzz-stack")
    make_stack(org, "fuzz-other")
    _, school_secret = make_key(org, user=admin, name="fuzz-school")
    _, bound_secret = make_key(org, stack=stack, user=admin, name="fuzz-bound")
    spare_key, _ = make_key(org, user=admin, name="fuzz-spare")
    member = make_user(org, role=Membership.Role.TEACHER)
    elsewhere = make_stack(make_org(), "fuzz-elsewhere")
    memory_id = _seed_memory(school_secret, stack.slug)
    return World(
        school_secret=school_secret,
        bound_secret=bound_secret,
        path_values={
            "stack": stack.slug,
            "memory_id": memory_id,
            "key_id": spare_key.public_id,
            "user_id": member.public_id,
            "key": "fuzz-key",
        },
        other_org_stack=elsewhere.slug,
    )


def _seed_memory(secret: str, stack: str) -> str:
    """A real memory to aim at, created through the public API so this keeps working while the
    memory services evolve. Falls back to an unknown id (requests then exercise the 404 path)."""
    response = Client().post(f"/api/v1/stacks/{stack}/memories",
                             data=json.dumps({"kind": "note", "content": "fuzz seed note"}),
                             content_type="application/json", headers={"authorization": f"Bearer {secret}"})
    if response.status_code == 201:
        return str(response.json()["id"])
    return str(uuid.uuid4())


# --- sending -------------------------------------------------------------------------------------

@dataclass
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    content_type: str | None
    body: bytes

    def describe(self) -> str:
        shown = {k: (v[:40] + "…" if len(v) > 40 else v) for k, v in self.headers.items()}
        body = self.body[:MAX_BODY_IN_REPORT]
        more = f" …(+{len(self.body) - MAX_BODY_IN_REPORT} bytes)" if len(self.body) > MAX_BODY_IN_REPORT else ""
        url = self.url if len(self.url) <= 300 else self.url[:300] + f"…(+{len(self.url) - 300} chars)"
        return (f"{self.method} {url}\n      headers={shown} content-type={self.content_type!r}\n"
                f"      body={body!r}{more}")


class _TracebackCatcher(logging.Handler):
    """Keeps the last exception logged by the server while a request runs: the error handler and
    Django's request logger both log 500s with exc_info."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.last: str = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            formatter = logging.Formatter()
            self.last = formatter.formatException(record.exc_info)


_SERVER_LOGGERS = ("memoryhub.errors", "django.request", "django.server")


@contextmanager
def traceback_catcher() -> Iterator[_TracebackCatcher]:
    catcher = _TracebackCatcher()
    loggers = [logging.getLogger(name) for name in _SERVER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(catcher)
        # Thousands of expected 4xx would each log a warning; only errors matter here.
        logger.setLevel(logging.ERROR)
    try:
        yield catcher
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(catcher)
            logger.setLevel(level)


def build_url(path: str, query: dict[str, Any] | list[tuple[str, Any]] | None = None) -> str:
    if not query:
        return path
    items = query.items() if isinstance(query, dict) else query
    pairs: list[tuple[str, str]] = []
    for key, value in items:
        for one in (value if isinstance(value, list) else [value]):
            pairs.append((str(key), _query_text(one)))
    return path + "?" + urlencode(pairs, quote_via=quote)


def _query_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


@dataclass
class Outcome:
    failures: list[str] = field(default_factory=list)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)


def send(sent: Sent, catcher: _TracebackCatcher) -> Any:
    """The response, or the exception that escaped Django (recorded by the caller as a 500)."""
    client = Client(raise_request_exception=True)
    catcher.last = ""
    # Rate limits would turn most of a fuzz run into 429s (register allows 5 a minute); they
    # have their own tests. Each request starts with empty windows so it reaches the view.
    throttle_state_clear()
    kwargs: dict[str, Any] = {"headers": sent.headers}
    if sent.content_type is not None:
        kwargs["content_type"] = sent.content_type
    return client.generic(sent.method, sent.url, data=sent.body, **kwargs)


# --- checks --------------------------------------------------------------------------------------

JSON_TYPES = ("application/json", "application/problem+json")


def contract_problems(response: Any, method: str, *, api_route: bool,
                      documented_types: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with this response under the product standard (empty list: nothing)."""
    problems: list[str] = []
    status = response.status_code
    raw = b"".join(response.streaming_content) if getattr(response, "streaming", False) else response.content
    if status >= 500:
        problems.append(f"status {status}")
    if b"Traceback (most recent call last)" in raw:
        problems.append("the body contains a stack trace")
    if not api_route or method == "HEAD":  # HEAD answers carry no body by definition
        return problems
    content_type = response.get("Content-Type", "").split(";")[0].strip().lower()
    if 400 <= status < 500 or status >= 500:
        if content_type not in JSON_TYPES:
            problems.append(f"{status} with content type {content_type!r}, not JSON")
            return problems
        problems.extend(_error_shape_problems(raw, status))
    elif 200 <= status < 300 and status != 204 and raw:
        if content_type not in JSON_TYPES and content_type not in documented_types:
            problems.append(f"{status} with undocumented content type {content_type!r}")
    return problems


def _error_shape_problems(raw: bytes, status: int) -> list[str]:
    try:
        body = json.loads(raw)
    except ValueError:
        return [f"{status} body is not valid JSON: {raw[:200]!r}"]
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return [f"{status} body lacks the error object: {raw[:200]!r}"]
    problems = []
    if not isinstance(error.get("code"), str) or not error.get("code"):
        problems.append(f"{status} error.code missing: {raw[:200]!r}")
    if not isinstance(error.get("message"), str):
        problems.append(f"{status} error.message missing: {raw[:200]!r}")
    if not isinstance(error.get("fields"), dict):
        problems.append(f"{status} error.fields is not an object: {raw[:200]!r}")
    if not isinstance(body.get("detail"), str):
        problems.append(f"{status} detail missing: {raw[:200]!r}")
    return problems


# Tables a rejected request must leave exactly as they were. Row counts plus the columns that
# change on an update (memory change_seq, key revocation, stack status) catch a half-done write.
def state_snapshot() -> Any:
    """One row of named counts (a failure message shows which one moved)."""
    m, k, s = Memory._meta.db_table, ApiKey._meta.db_table, Stack._meta.db_table
    counted = [User, Membership, TeacherAssignment, Checkpoint, BootConfigEntry]
    counts = ", ".join(f"(SELECT count(*) FROM {model._meta.db_table}) AS {model._meta.db_table}"  # noqa: S608
                       for model in counted)
    sql = (f"SELECT (SELECT count(*) FROM {m}) AS memories, "  # noqa: S608 - table names
           f"(SELECT max(change_seq) FROM {m}) AS max_change_seq, "
           f"(SELECT count(*) FROM {k}) AS keys, "
           f"(SELECT count(*) FROM {k} WHERE revoked_at IS NOT NULL) AS revoked_keys, "
           f"(SELECT count(*) FROM {s}) AS stacks, "
           f"(SELECT count(*) FROM {s} WHERE status <> 'active') AS inactive_stacks, {counts}")
    (row,) = sql_rows(sql)
    return row


def check(sent: Sent, catcher: _TracebackCatcher, outcome: Outcome, *, api_route: bool,
          documented_types: tuple[str, ...] = (), check_state: bool = True) -> None:
    """Send one request and record every way its response breaks the standard."""
    before = state_snapshot() if check_state else None
    outcome.requests += 1
    try:
        response = send(sent, catcher)
    except Exception as exc:  # an exception escaping Django is a 500 in production
        trace = catcher.last or f"{type(exc).__name__}: {exc}"
        outcome.failures.append(f"{sent.describe()}\n      -> unhandled {type(exc).__name__}\n{_tail(trace)}")
        return
    outcome.statuses[response.status_code] += 1
    problems = contract_problems(response, sent.method, api_route=api_route, documented_types=documented_types)
    if before is not None and 400 <= response.status_code < 500:
        after = state_snapshot()
        if after != before:
            problems.append(f"rejected with {response.status_code} but stored something: {before} -> {after}")
    if problems:
        trace = f"\n{_tail(catcher.last)}" if catcher.last else ""
        outcome.failures.append(f"{sent.describe()}\n      -> {'; '.join(problems)}{trace}")


def _tail(trace: str, lines: int = 8) -> str:
    return "\n".join("        " + line for line in trace.strip().splitlines()[-lines:])


# --- routes --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Route:
    pattern: str  # e.g. "api/v1/stacks/<str:stack>/memories/<uuid:memory_id>"
    methods: tuple[str, ...]
    api: bool  # a DRF view: the JSON error contract applies

    def fill(self, values: dict[str, str]) -> str:
        """The concrete path with each <conv:name> replaced by values[name] (already encoded)."""
        path = self.pattern
        for name, value in values.items():
            for converter in ("str", "uuid", "int", "slug", "path"):
                path = path.replace(f"<{converter}:{name}>", value)
        return "/" + path

    @property
    def params(self) -> list[tuple[str, str]]:
        import re
        return [(m.group(2), m.group(1)) for m in re.finditer(r"<(\w+):(\w+)>", self.pattern)]


def all_routes() -> list[Route]:
    """Every route Django resolves, from the live URLconf: a route added tomorrow is covered."""
    routes: list[Route] = []

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for entry in patterns:
            text = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, text)
                continue
            if text.startswith(EXCLUDED_PREFIXES) or "(?P" in text or text.startswith("^"):
                continue
            view_class = getattr(entry.callback, "cls", None) or getattr(entry.callback, "view_class", None)
            is_api = isinstance(view_class, type) and issubclass(view_class, APIView) and text not in DOC_ROUTES
            if isinstance(view_class, type):
                names: list[str] = getattr(view_class, "http_method_names", [])
                methods = tuple(m.upper() for m in names
                                if hasattr(view_class, m) and m not in ("options", "head"))
            else:
                methods = ("GET", "POST")
            routes.append(Route(pattern=text, methods=methods or ("GET",), api=is_api))

    walk(get_resolver().url_patterns, "")
    unique = {route.pattern: route for route in routes}
    return sorted(unique.values(), key=lambda r: r.pattern)


def encode_path_value(value: str) -> str:
    return quote(value, safe="")
