"""Dashboard: billing (being built)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def billing(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404
