"""Websocket URL routes for every app. The last route answers every other path (a clean refusal)."""

from __future__ import annotations

from django.urls import path, re_path

from dashboard.consumers import SchoolConsumer, StackConsumer
from memoryhub.consumers import ProbeConsumer, websocket_not_found

websocket_urlpatterns = [
    path("ws/probe/", ProbeConsumer.as_asgi()),
    path("ws/stacks/<str:slug>/", StackConsumer.as_asgi()),  # a student's page
    path("ws/school/", SchoolConsumer.as_asgi()),  # the school overview's counters
    re_path(r"", websocket_not_found),  # type: ignore[arg-type]  # an ASGI app: what channels' router takes
]
