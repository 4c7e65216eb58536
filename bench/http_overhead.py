"""Fixed per-request overhead of authenticated API calls: HTTP vs in-process, side by side.

    .venv/bin/python bench/http_overhead.py                   # 500 requests per figure
    .venv/bin/python bench/http_overhead.py --requests 200    # quicker while developing

One run against real embedded Postgres and Redis and the real ASGI app under uvicorn (one worker,
one client with a persistent connection, sequential requests). Figures, all in the same run:

* `GET /health` over HTTP: the floor of this server and client (no auth, no DB, no throttle);
* `GET /api/v1/stacks/<stack>/` and `GET /auth/me` with a raw `knl_sk_` key and with a JWT,
  over HTTP: what a trivial authenticated call costs end to end;
* the same requests in-process through Django's test client (the full middleware, auth,
  throttle and view, but no ASGI server, no socket, no thread hop);
* `view only`: the stack view's own work (the access selector and serializer) called directly.

Every HTTP figure is measured twice in the same run: against `memoryhub.asgi:application` (the
single-hop handler) and against a baseline server running Django's stock `get_asgi_application()`
(an async middleware chain: one thread hop per middleware hook). The gap between a row's HTTP and
in-process figures is what the ASGI path adds; the gap between in-process and `view only` is
middleware + authentication + throttling.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, percentiles, print_table, web_server


def _measure(fn: Callable[[], Any], *, requests: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(requests):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def _measure_alternating(fn: Callable[[], Any], baseline: Callable[[], Any], *, requests: int,
                         warmup: int) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        fn()
        baseline()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(requests):
        for target, into in ((fn, samples[0]), (baseline, samples[1])):
            t0 = time.perf_counter()
            target()
            into.append((time.perf_counter() - t0) * 1000)
    return samples


def _row(name: str, samples: list[float]) -> dict[str, Any]:
    p = percentiles(samples)
    return {"figure": name, "n": p["n"], "p50 ms": p["p50"], "p95 ms": p["p95"], "mean ms": p["mean"]}


def stock_django_app() -> Any:
    """The baseline: Django's own ASGI handler (uvicorn `--factory`)."""
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="measured requests per figure")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with bench_environment("http-overhead") as env:
        import httpx
        from django.test import Client

        from accounts.authentication import access_token_for_key
        from accounts.models import Membership, Organization, User
        from accounts.principal import Principal
        from accounts.services import api_key_issue
        from stacks.models import Stack
        from stacks.selectors import stack_for_principal

        org = Organization.objects.create(slug="bench-overhead", name="Bench Overhead", tier="unlimited")
        stack = Stack.objects.create(organization=org, slug="student-0001")
        user = User.objects.create_user(username="bench-overhead", email="bench-overhead@example.test",
                                        password="x" * 20)
        Membership.objects.create(user=user, organization=org, role=Membership.Role.ADMIN)
        key, secret = api_key_issue(organization=org, user=user, stack_id=stack.pk, name="bench", read_only=False,
                                    stack_agent=True)
        jwt = str(access_token_for_key(key))
        stack_path = f"/api/v1/stacks/{stack.slug}/"

        def ok(response: Any) -> None:
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.content[:300]!r}")

        rows: list[dict[str, Any]] = []
        requests = {"stack detail (key)": (stack_path, secret), "stack detail (JWT)": (stack_path, jwt),
                    "auth/me (key)": ("/auth/me", secret)}
        # The real throttle stays on the path (Redis on every request); its rate is raised so the
        # benchmark measures the overhead, not the limiter.
        extra_env = {"THROTTLE_REQUEST_RATE": "10000000/min"}
        # Both servers are up at once and every figure alternates requests between them, so
        # the machine's background load hits the figure and its baseline alike.
        stock_app = "bench.http_overhead:stock_django_app"
        with web_server(env, extra_env=extra_env) as url, \
                web_server(env, extra_env=extra_env, app=stock_app, factory=True) as stock_url, \
                httpx.Client(base_url=url, timeout=30) as client, \
                httpx.Client(base_url=stock_url, timeout=30) as stock_client:
            log(f"single-hop server at {url}, stock Django ASGI server at {stock_url}")
            figures: dict[str, tuple[str, dict[str, str]]] = {"GET /health": ("/health", {})}
            for name, (path, credential) in requests.items():
                figures[name] = (path, {"Authorization": f"Bearer {credential}"})
            for name, (path, headers) in figures.items():
                ours, baseline = _measure_alternating(
                    lambda path=path, headers=headers: ok(client.get(path, headers=headers)),  # type: ignore[misc]
                    lambda path=path, headers=headers: ok(stock_client.get(path, headers=headers)),  # type: ignore[misc]
                    requests=args.requests, warmup=args.warmup)
                rows.append(_row(f"{name}  HTTP", ours))
                rows.append(_row(f"{name}  HTTP stock Django ASGI (baseline)", baseline))

        from django.conf import settings

        rest_framework: Any = settings.REST_FRAMEWORK
        rest_framework["DEFAULT_THROTTLE_RATES"]["request"] = extra_env["THROTTLE_REQUEST_RATE"]
        django_client = Client(raise_request_exception=True)
        rows.append(_row("GET /health  in-process", _measure(lambda: ok(django_client.get("/health")),
                                                            requests=args.requests, warmup=args.warmup)))
        for name, (path, credential) in requests.items():
            rows.append(_row(f"{name}  in-process", _measure(
                lambda path=path, credential=credential: ok(  # type: ignore[misc]
                    django_client.get(path, HTTP_AUTHORIZATION=f"Bearer {credential}")),
                requests=args.requests, warmup=args.warmup)))

        principal = Principal(user=user, organization=org, api_key=key, bound_stack_id=stack.pk, read_only=False,
                              role=Membership.Role.ADMIN, credential_id=key.public_id)
        from stacks.serializers import StackSerializer

        rows.append(_row("stack detail  view only", _measure(
            lambda: StackSerializer(stack_for_principal(principal, stack.slug)).data,
            requests=args.requests, warmup=args.warmup)))
        print_table("fixed per-request overhead (one worker, one client, sequential)", rows)


if __name__ == "__main__":
    main()
