"""Liveness and readiness probes, metrics, `/favicon.ico` and the OpenAPI document's generator: the
only endpoints that need no authentication."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar, cast

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.utils import translation
from django.views.decorators.cache import cache_control, never_cache
from django.views.decorators.http import require_GET
from drf_spectacular.generators import SchemaGenerator

from memoryhub.health import embedding_backlog, readiness
from memoryhub.metrics import metrics_allowed, metrics_response

logger = logging.getLogger(__name__)
# Has this process ever answered ready? Before that a 503 is start-up (the runner polls /readyz
# until it is 200), after it an outage.
_was_ready = False


@never_cache
@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """200 while the process serves requests; touches no backing service (kernle's health check)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 only when database (with pgvector), Redis and a Celery worker answer; else 503 naming them."""
    global _was_ready
    checks = readiness()
    failing = [name for name, result in checks.items() if not result.ok]
    backlog = embedding_backlog() if checks["database"].ok else None
    body = {
        "status": "ok" if not failing else "unavailable",
        "checks": {name: {"ok": r.ok, "detail": r.detail} for name, r in checks.items()},
        "failing": failing,
        # Informational (never part of `failing`): memories awaiting a current embedding, counted
        # up to a cap (memoryhub.health.BACKLOG_COUNT_CAP), and whether more await.
        "embedding_backlog": backlog[0] if backlog is not None else None,
        "embedding_backlog_capped": backlog[1] if backlog is not None else None,
    }
    response = JsonResponse(body, status=200 if not failing else 503)
    if failing:
        response["Retry-After"] = "5"
        # A 503 here is the probe's answer, not a server error: Django would log it as
        # `ERROR django.request`, every half second while the service starts. We log it ourselves:
        # an outage (this process was ready before) at WARNING naming the failing parts, start-up
        # at DEBUG.
        response._has_been_logged = True  # type: ignore[attr-defined]
        details = "; ".join(f"{name}: {checks[name].detail}" for name in failing)
        logger.log(logging.WARNING if _was_ready else logging.DEBUG, "not ready: %s", details)
    else:
        _was_ready = True
    return response


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition (memoryhub.metrics): with the METRICS_TOKEN bearer token, or from
    loopback without one; anyone else gets a plain 404, as if there were nothing here."""
    if not metrics_allowed(request):
        raise Http404
    return metrics_response()


@cache_control(public=True, max_age=86_400)
@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page links: send them to the icon's hashed static
    URL (WhiteNoise serves it, cached for good), so no page logs a 404 for it. Temporary (302): the
    hash changes when the icon does."""
    return HttpResponseRedirect(static("icons/favicon.ico"))


class OnceGeneratedSchema(SchemaGenerator):
    """drf-spectacular's generator, generating the public OpenAPI document once per process, API
    version and language. `/api/schema/` is public and unthrottled, and generating the document is
    costly (docs/architecture.md §2.5): unmemoized, anyone could keep a core busy by asking for it."""

    _documents: ClassVar[dict[tuple[str | None, str | None], dict[str, Any]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def get_schema(self, request: Any = None, public: bool = False) -> dict[str, Any]:
        if not public:
            return cast(dict[str, Any], super().get_schema(request=request, public=public))
        # `?lang=` may be anything: key on the language Django would really use for it (one of
        # settings.LANGUAGES), so strangers' values neither regenerate nor pile up documents.
        try:
            language = translation.get_supported_language_variant(translation.get_language() or "")
        except LookupError:
            language = translation.get_supported_language_variant(settings.LANGUAGE_CODE)
        key = (self.api_version or getattr(request, "version", None), language)
        with self._lock:  # one generation per key, even when requests arrive together
            if key not in self._documents:
                self._documents[key] = super().get_schema(request=request, public=public)
            return self._documents[key]
