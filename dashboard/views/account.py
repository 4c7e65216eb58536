"""Dashboard: account (being built)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def password_change(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404
