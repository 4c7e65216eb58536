"""Dashboard: roster (being built)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def roster(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def student_create(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def student_archive(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def student_unarchive(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404


def student_teachers(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    raise Http404
