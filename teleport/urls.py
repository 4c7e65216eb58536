"""Teleport routes (teleport/api.py), included by memoryhub/urls.py."""

from __future__ import annotations

from teleport import api

urlpatterns = api.urlpatterns
