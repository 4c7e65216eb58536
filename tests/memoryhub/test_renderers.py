"""The API's JSON renderer (memoryhub/renderers.py) sends the bytes DRF's own renderer would."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer

from memoryhub.renderers import FastJSONRenderer
from tests.actors import School

NOW = datetime(2026, 11, 25, 2, 41, 4, 995766, tzinfo=UTC)

CASES = {
    "a search-like page": {"results": [{"id": uuid.UUID(int=n), "content": "fractions — ünïcode ✓", "score": 0.8231,
                                        "created_at": NOW, "tags": ["quiz"], "meta": {"n": n, "ok": True, "x": None}}
                                       for n in range(5)], "server_time": NOW},
    "datetimes": [NOW, NOW.replace(microsecond=0), NOW.replace(tzinfo=None),
                  NOW.astimezone(timezone(timedelta(hours=2))), date(2026, 1, 2), NOW.time()],
    "what only DRF's hook knows": {"price": Decimal("1.50"), "lazy": gettext_lazy("Stack not found."),
                                   "took": timedelta(seconds=90), "ids": (1, 2), "bytes": b"abc"},
    "line separators": {"text": "a\u2028b\u2029c"},
    "non-string keys": {1: "one", 2.5: "two and a half"},
    "floats": [0.1, 1e16, 5.0, -0.0, 123456789.123],
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_bytes_as_drf(name: str) -> None:
    data = CASES[name]
    fast, drf = FastJSONRenderer().render(data), JSONRenderer().render(data)
    assert json.loads(fast) == json.loads(drf)
    if name != "floats":  # 1e16: orjson writes 1e16, json 1e+16 — the same number
        assert fast == drf


def test_line_separators_are_escaped_as_drf_does() -> None:
    assert FastJSONRenderer().render({"text": "a\u2028b"}) == b'{"text":"a\\u2028b"}'


def test_what_orjson_refuses_is_rendered_by_drf() -> None:
    huge = {"n": 2**70}
    assert FastJSONRenderer().render(huge) == JSONRenderer().render(huge) == b'{"n":1180591620717411303424}'


def test_indented_output_on_request_and_no_body_for_none() -> None:
    data = {"a": [1, 2]}
    indented = FastJSONRenderer().render(data, "application/json; indent=2", {})
    assert indented == JSONRenderer().render(data, "application/json; indent=2", {}) and b"\n" in indented
    assert FastJSONRenderer().render(None) == b""


@pytest.mark.django_db
def test_the_api_answers_through_it(school: School) -> None:
    response = school.agent.get(school.stack_url("load"))
    assert response.status_code == 200
    assert isinstance(response.accepted_renderer, FastJSONRenderer)
    assert response.content == JSONRenderer().render(response.data)
