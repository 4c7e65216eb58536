"""Dashboard: student (being built)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def student_page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def memory_detail(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def memory_action(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def export_json(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def export_markdown(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404
