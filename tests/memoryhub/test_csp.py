"""Every response carries the Content-Security-Policy of settings.CONTENT_SECURITY_POLICY (memoryhub.csp)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.actors import School


def test_the_policy_says_what_the_setting_says(client: Client) -> None:
    policy = dict(part.split(" ", 1) for part in client.get("/health")["Content-Security-Policy"].split("; "))
    assert policy == {"default-src": "'self'", "script-src": "'self'", "style-src": "'self'",
                      "img-src": "'self' data:", "connect-src": "'self'", "font-src": "'self'",
                      "object-src": "'none'", "base-uri": "'self'", "form-action": "'self'",
                      "frame-ancestors": "'none'"}


@pytest.mark.django_db
def test_pages_api_answers_and_errors_all_carry_it(client: Client, school: School) -> None:
    expected = client.get("/health")["Content-Security-Policy"]
    page = client.get("/login/")
    answer = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "Likes chess"},
                               format="json")
    refused = school.agent.post(school.stack_url("memories"), {"kind": "note"}, format="json")
    missing = client.get("/no/such/page/")
    assert [page.status_code, answer.status_code, refused.status_code, missing.status_code] == [200, 201, 400, 404]
    for response in (page, answer, refused, missing):
        assert response["Content-Security-Policy"] == expected
