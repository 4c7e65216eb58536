"""Websocket URL routes for every app."""

from __future__ import annotations

from django.urls import path

from memoryhub.consumers import ProbeConsumer

websocket_urlpatterns = [
    path("ws/probe/", ProbeConsumer.as_asgi()),
]
