"""Each response to an authenticated caller says where its time went (memoryhub.timing)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.http import HttpResponseBase
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.actors import School
from tests.factories import session_client

_TIMING = re.compile(r'app;dur=(?P<app>[\d.]+), cpu;dur=(?P<cpu>[\d.]+), '
                     r'db;dur=(?P<db>[\d.]+);desc="(?P<statements>\d+) statements?"')


def timings(response: HttpResponseBase) -> dict[str, float]:
    match = _TIMING.fullmatch(response["Server-Timing"])
    assert match is not None, response["Server-Timing"]
    return {name: float(value) for name, value in match.groupdict().items()}


@pytest.mark.django_db
def test_an_agents_request_gets_its_time_split_into_cpu_and_database(school: School) -> None:
    school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "Likes chess"}, format="json")
    with CaptureQueriesContext(connection) as queries:
        response = school.agent.get(school.stack_url("memories"))
    assert response.status_code == 200
    split = timings(response)
    # Every statement the request ran is counted, but the access log's: it is written once the
    # response has gone (in its own savepoint), after the header was set.
    answered = [q["sql"] for q in queries.captured_queries
                if "memories_memoryaccess" not in q["sql"] and "SAVEPOINT" not in q["sql"]]
    assert split["statements"] == len(answered) > 0
    assert 0 < split["db"] <= split["app"] and split["cpu"] > 0


@pytest.mark.django_db
def test_a_dashboard_session_gets_it_too(school: School) -> None:
    response = session_client(school.admin).get(school.stack_url("memories"))
    assert response.status_code == 200 and timings(response)["statements"] > 0


@pytest.mark.django_db
def test_anonymous_callers_and_failed_credentials_get_no_split(school: School) -> None:
    # A split would tell an anonymous caller what the answer hides (which path a refusal took).
    anonymous = APIClient()
    assert "Server-Timing" not in anonymous.get("/health")
    refused = anonymous.get(school.stack_url("memories"), HTTP_AUTHORIZATION="Bearer knl_sk_not-a-real-key")
    assert refused.status_code == 401 and "Server-Timing" not in refused
    reset = anonymous.post("/password-reset/", {"email": "nobody@example.org"})
    assert reset.status_code < 500 and "Server-Timing" not in reset


@pytest.mark.django_db
@override_settings(SERVER_TIMING=False)
def test_it_can_be_turned_off(school: School) -> None:
    response = school.agent.get(school.stack_url("memories"))
    assert response.status_code == 200 and "Server-Timing" not in response
