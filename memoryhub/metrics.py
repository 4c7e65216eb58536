"""Prometheus metrics (docs/operations.md §11), with the official client library.

What is measured, and where it is counted:
* HTTP requests by route pattern (never the path: it names stacks and memories), method and status,
  and their latency — `MetricsMiddleware`, first in the middleware list;
* sync push operations by protocol and outcome (applied / conflict) — memories.sync.push;
* search latency — memories.api.search; embeddings stored and each one's time to searchable
  (from the memory's acknowledged write to its stored vector) — memories.search.embedding_jobs;
* job runs and their durations by job and status — memories.lifecycle.jobs.run_job;
* open websocket connections — memoryhub.limits.WebsocketGuard (every websocket passes it);
* the bulk lane's limit, running and waiting requests, and its refusals — memoryhub.lanes;
* webhook deliveries by outcome — webhooks.dispatch; payment verifications by result — billing;
* the embedding backlog and its lag (the oldest awaiting change's age), read from the database
  when scraped; the recent time to searchable's p50 and p95 over the whole service, read from
  Redis when scraped (memoryhub.time_to_searchable: right whichever host the workers run on).

Several processes (uvicorn workers, Celery's pool) each count their own: with
PROMETHEUS_MULTIPROC_DIR set (the runner sets it to DATA_DIR/metrics and empties it at start) the
client library keeps the values in files there and `/metrics` adds them up. Without it (tests, a
single process) the default in-process registry is used.

Labels are route patterns, names and outcomes only: no memory text, id, key or address.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter("memoryhub_http_requests", "HTTP requests answered, by route pattern, method and status.",
                        ["route", "method", "status"])
HTTP_LATENCY = Histogram("memoryhub_http_request_duration_seconds", "Time to answer an HTTP request, by route.",
                         ["route", "method"], buckets=_LATENCY_BUCKETS)
PUSH_OPERATIONS = Counter("memoryhub_sync_push_operations", "Sync push operations, by protocol and outcome.",
                          ["protocol", "outcome"])
SEARCH_LATENCY = Histogram("memoryhub_search_duration_seconds", "Time to answer a memory search.",
                           buckets=_LATENCY_BUCKETS)
EMBEDDINGS_STORED = Counter("memoryhub_embeddings_stored", "Memory vectors computed and stored.")
TIME_TO_SEARCHABLE = Histogram(
    "memoryhub_time_to_searchable_seconds",
    "Seconds from a memory's acknowledged write to its stored vector (searchable by meaning from then on).",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600))
BULK_LANE_LIMIT = Gauge("memoryhub_bulk_lane_limit", "Bulk requests the web processes admit at once now "
                        "(memoryhub.lanes: adapts to interactive latency).", multiprocess_mode="livesum")
BULK_LANE_RUNNING = Gauge("memoryhub_bulk_lane_running", "Bulk requests running now.", multiprocess_mode="livesum")
BULK_LANE_WAITING = Gauge("memoryhub_bulk_lane_waiting", "Bulk requests waiting for a place now.",
                          multiprocess_mode="livesum")
INTERACTIVE_SLOWDOWN = Gauge(
    "memoryhub_interactive_slowdown", "How many times slower than unloaded interactive requests run now: the "
    "median of a web process's latest ones against their routes' unloaded latency, the slowest process's "
    "(memoryhub.lanes).", multiprocess_mode="livemax")
BULK_LANE_REFUSALS = Counter("memoryhub_bulk_lane_refusals", "Bulk requests refused with Retry-After, by error code.",
                             ["code"])
JOB_RUNS = Counter("memoryhub_job_runs", "Background job runs, by job and final status.", ["job", "status"])
JOB_DURATION = Histogram("memoryhub_job_duration_seconds", "Background job run time, by job.", ["job"],
                         buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600))
WEBSOCKETS_OPEN = Gauge("memoryhub_websocket_connections", "Open websocket connections.",
                        multiprocess_mode="livesum")
WEBHOOK_DELIVERIES = Counter("memoryhub_webhook_deliveries", "Webhook delivery attempts, by outcome.", ["outcome"])
PAYMENT_VERIFICATIONS = Counter("memoryhub_payment_verifications", "On-chain payment checks, by result.",
                                ["result"])


class _BacklogCollector(Collector):
    """The embedding backlog and its lag, read from the database when scraped (one statement over
    the backlog's partial index and its rows)."""

    _families = (
        ("memoryhub_embedding_backlog", "Memories awaiting a current embedding."),
        ("memoryhub_embedding_lag_seconds",
         "Seconds since the oldest change still awaiting a current embedding (0: none awaits)."),
    )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # What registering asks for: without it the registry would collect, i.e. query the
        # database, at import time.
        for name, documentation in self._families:
            yield GaugeMetricFamily(name, documentation)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from memoryhub.health import embedding_backlog_and_lag

        figures = embedding_backlog_and_lag()
        if figures is None:  # database down: the gauges are absent from this scrape, the rest still answers
            return
        for (name, documentation), figure in zip(self._families, figures, strict=True):
            family = GaugeMetricFamily(name, documentation)
            family.add_metric([], float(figure))
            yield family


class _RecentSearchableCollector(Collector):
    """The service's time to searchable over the last minutes, read from Redis when scraped
    (memoryhub.time_to_searchable): every worker's samples, on whatever host it runs, where the
    histogram adds up only this host's processes."""

    _quantiles = ("0.5", "0.95")

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("memoryhub_time_to_searchable_recent_seconds", "", labels=["quantile"])
        yield GaugeMetricFamily("memoryhub_time_to_searchable_recent_samples", "")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from memoryhub import time_to_searchable

        seconds = [wait for _, wait in time_to_searchable.recent(None)]
        window = f"the last {time_to_searchable.WINDOW_SECONDS // 60} minutes"
        samples = GaugeMetricFamily(
            "memoryhub_time_to_searchable_recent_samples",
            f"Memory vectors stored in {window} (at most the newest {time_to_searchable.KEEP}).")
        samples.add_metric([], float(len(seconds)))
        yield samples
        if not seconds:  # no vector stored lately: no quantile to state
            return
        family = GaugeMetricFamily("memoryhub_time_to_searchable_recent_seconds",
                                   f"Time to searchable of the memory vectors stored in {window}, by quantile.",
                                   labels=["quantile"])
        for q in self._quantiles:
            family.add_metric([q], time_to_searchable.quantile(seconds, float(q)))
        yield family


_backlog = _BacklogCollector()
_recent_searchable = _RecentSearchableCollector()
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    REGISTRY.register(_backlog)
    REGISTRY.register(_recent_searchable)


def _exposition() -> bytes:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(_backlog)
    registry.register(_recent_searchable)
    return generate_latest(registry)


def _loopback_direct(request: HttpRequest) -> bool:
    """From this machine and not relayed by a proxy (a proxy on this machine would make every
    outside request look local)."""
    if request.META.get("HTTP_X_FORWARDED_FOR") or request.META.get("HTTP_FORWARDED"):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def metrics_allowed(request: HttpRequest) -> bool:
    """`Authorization: Bearer <METRICS_TOKEN>` from anywhere; without the token, loopback only."""
    token = getattr(settings, "METRICS_TOKEN", "")
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode()):
        return True
    return _loopback_direct(request)


def metrics_response() -> HttpResponse:
    return HttpResponse(_exposition(), content_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Counts and times every HTTP request by its route pattern (`/api/v1/stacks/<slug>/…`, not
    the path, which names stacks and memories)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = "/" + match.route if match is not None and match.route else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
        HTTP_LATENCY.labels(route, method).observe(time.perf_counter() - started)
        return response


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
