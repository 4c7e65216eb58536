"""Shared API pagination: opaque cursors, stable under concurrent inserts."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class StableCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = "-created_at"
