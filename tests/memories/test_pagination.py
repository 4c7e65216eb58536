"""One rule for cursors (memoryhub/pagination.py, docs/architecture.md §8.1): absent or empty is the
first page, a cursor the API returned continues the walk, anything else is 400 `invalid_cursor`
naming `cursor` — on every cursor-paginated list, never a silent restart from the first page."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from accounts.throttles import throttle_state_clear
from memories.services import memory_create
from tests.actors import School

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# Cursors the API never issues. DRF's own reader restarted from the first page on the first four
# (base64 of a query string without a position or offset) and answered 404 on the next ones.
FOREIGN_CURSORS = [
    _b64("abc"), _b64("x=1"), _b64("o=0"), _b64("r=1"),
    "garbage", "!!!!", _b64("o=-5&p=2026-01-01 00:00:00+00:00"), _b64("r=2&p=2026-01-01 00:00:00+00:00"),
    _b64("o=1&o=2"), _b64("p=2026-01-01 00:00:00+00:00&q=1"), _b64("p=not-a-date"),
    _b64("p=2026-13-45T99:99:99"), _b64("p=2026-01-01 00:00:00"),  # naive: we issue aware positions only
    _b64("p=9999-12-31 23:59:59-23:00"), _b64("o=+1&p=2026-01-01 00:00:00+00:00"),
    _b64("p=2026-01-01 00:00:00+00:00") + "*",  # a character outside base64's alphabet
]


def _next_cursor(body: dict[str, Any]) -> str:
    return parse_qs(urlparse(body["next"]).query)["cursor"][0]


def _memories(school: School, count: int) -> None:
    for i in range(count):
        memory_create(stack=school.stack, kind="note", source="test", payload={"content": f"note {i}"})


@pytest.mark.parametrize("cursor", FOREIGN_CURSORS)
def test_a_memory_list_cursor_the_api_did_not_issue_is_400(school: School, cursor: str) -> None:
    _memories(school, 3)
    response = school.agent.get(school.stack_url("memories"), {"cursor": cursor, "limit": "2"})
    assert response.status_code == 400, (cursor, response.content)
    error = response.json()["error"]
    assert error["code"] == "invalid_cursor"
    assert list(error["fields"]) == ["cursor"]


def test_the_cursors_the_api_issues_walk_every_memory_once(school: School) -> None:
    _memories(school, 5)
    url = school.stack_url("memories")
    first = school.agent.get(url, {"limit": "2"}).json()
    seen = [m["id"] for m in first["results"]]
    body = first
    while body["next"]:
        body = school.agent.get(url, {"limit": "2", "cursor": _next_cursor(body)}).json()
        seen += [m["id"] for m in body["results"]]
    assert len(seen) == 5 == len(set(seen))
    # The previous link's cursor (reverse) is one the API issued too.
    previous = parse_qs(urlparse(body["previous"]).query)["cursor"][0]
    assert school.agent.get(url, {"limit": "2", "cursor": previous}).status_code == 200
    # Absent or empty: the first page.
    assert [m["id"] for m in school.agent.get(url, {"limit": "2", "cursor": ""}).json()["results"]] == seen[:2]


@pytest.mark.parametrize("path", ["/api/v1/stacks/", "/api/v1/members/", "/api/v1/audit/"])
def test_every_cursor_paginated_list_shares_the_rule(school: School, path: str) -> None:
    assert school.admin_api.get(path).status_code == 200
    for cursor in (_b64("abc"), "garbage", _b64("p=not-a-date")):
        response = school.admin_api.get(path, {"cursor": cursor})
        assert response.status_code == 400, (path, cursor, response.content)
        assert response.json()["error"]["code"] == "invalid_cursor"
