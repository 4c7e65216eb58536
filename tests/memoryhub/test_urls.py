"""The root URL configuration (memoryhub/urls.py) tries the agents' routes first; the order must
never change what a path reaches."""

from __future__ import annotations

import re

from django.urls import URLPattern, URLResolver, get_resolver, resolve

SAMPLES = {"int": "7", "uuid": "00000000-0000-4000-8000-000000000001", "path": "a/b", "slug": "a-1", "str": "a-1"}


def _routes(patterns: list[URLPattern | URLResolver], prefix: str = "") -> list[str]:
    routes = []
    for entry in patterns:
        text = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            routes += _routes(entry.url_patterns, text)
        elif not text.startswith(("admin/", "^")) and "(?P" not in text:  # Django's admin: regexes
            routes.append(text)
    return routes


def test_every_route_is_reached_by_its_own_paths() -> None:
    routes = _routes(get_resolver().url_patterns)
    assert len(routes) > 100  # the walk found the includes
    shadowed = {}
    for route in routes:
        path = "/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLES[str(m.group(1) or "str")], route)
        reached = resolve(path).route
        if reached != route:
            shadowed[route] = reached
    assert not shadowed
