"""Websocket URL routes for every app. The last route answers every other path (a clean refusal)."""

from __future__ import annotations

from django.urls import path, re_path

from memoryhub.consumers import ProbeConsumer, websocket_not_found

websocket_urlpatterns = [
    path("ws/probe/", ProbeConsumer.as_asgi()),
    re_path(r"", websocket_not_found),  # type: ignore[arg-type]  # an ASGI app: what channels' router takes
]
