"""Responses are gzip-compressed at RESPONSE_GZIP_LEVEL (memoryhub/compression.py) and still read
as the same JSON; small bodies, clients without gzip and level 0 get the body as it is."""

from __future__ import annotations

import gzip
import json

import pytest
from pytest_django.fixtures import SettingsWrapper

from tests.actors import School

pytestmark = pytest.mark.django_db

NOTE = "Fractions: halves and quarters practised with pizza slices, then with a ruler and a clock. "


def _with_notes(school: School, count: int = 30) -> None:
    for n in range(count):
        response = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": f"{n} {NOTE * 3}"},
                                     format="json")
        assert response.status_code == 201, response.content


def _load(school: School, encoding: str | None) -> tuple[bytes, dict[str, str]]:
    url = school.stack_url("load")
    response = school.agent.get(url) if encoding is None else school.agent.get(url, HTTP_ACCEPT_ENCODING=encoding)
    assert response.status_code == 200
    return response.content, dict(response.headers)


def _memories(body: bytes) -> list[str]:
    return [item["text"] for item in json.loads(body)["memories"]]


def test_a_client_that_accepts_gzip_gets_the_same_answer_in_fewer_bytes(school: School) -> None:
    _with_notes(school)
    plain, plain_headers = _load(school, None)
    packed, headers = _load(school, "gzip, deflate")
    assert "Content-Encoding" not in plain_headers
    assert headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in headers["Vary"]
    assert int(headers["Content-Length"]) == len(packed) < len(plain) / 3
    assert len(_memories(plain)) == 30 and _memories(gzip.decompress(packed)) == _memories(plain)
    # The header names a file of random length (against BREACH), as Django's middleware does.
    assert packed[3] & gzip.FNAME


def _deflated_size(packed: bytes) -> int:
    """The compressed stream's length, without the gzip header and its file name of random length."""
    assert packed[3] == gzip.FNAME  # no other optional fields: the name follows the 10-byte header
    return len(packed) - (packed.index(b"\0", 10) + 1)


def test_the_level_is_the_deployment_s_choice(school: School, settings: SettingsWrapper) -> None:
    _with_notes(school)
    sizes = {}
    for level in (1, 9):
        settings.RESPONSE_GZIP_LEVEL = level
        packed, headers = _load(school, "gzip")
        assert headers["Content-Encoding"] == "gzip"
        sizes[level] = _deflated_size(packed)
        assert len(_memories(gzip.decompress(packed))) == 30
    assert sizes[9] < sizes[1], sizes
    settings.RESPONSE_GZIP_LEVEL = 0
    body, headers = _load(school, "gzip")
    assert "Content-Encoding" not in headers and len(_memories(body)) == 30


def test_small_bodies_and_clients_without_gzip_are_left_alone(school: School) -> None:
    small = school.agent.get(school.stack_url("boot-config"), HTTP_ACCEPT_ENCODING="gzip")
    assert small.status_code == 200 and len(small.content) < 200 and "Content-Encoding" not in small.headers
    _with_notes(school, 5)
    body, headers = _load(school, "br, identity")
    assert "Content-Encoding" not in headers and len(_memories(body)) == 5
