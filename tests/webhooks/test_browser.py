"""The Webhooks pages in real Chromium: an admin adds an endpoint, copies the secret shown once,
sends a test event and reads the log — each page axe-clean, CSP-clean and screenshotted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.factories import make_org, make_stack, make_user
from tests.webhooks.conftest import Clock, Receiver, change_event, run
from webhooks import dispatch
from webhooks.models import WebhookEndpoint

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default


def checked(watched: WatchedPage, name: str, *, status: int = 200) -> None:
    """check_page, minus the live socket's handshake error: pytest-django's live server speaks
    plain WSGI, so the school-wide live socket (dashboard/live.py) cannot connect there."""
    watched.page.wait_for_load_state("load")
    watched.problems[:] = [p for p in watched.problems if "WebSocket connection" not in p]
    check_page(watched, name, status=status)


def test_an_admin_adds_an_endpoint_tests_it_and_reads_the_log(
        open_page: Callable[[], WatchedPage], dashboard_url: str, receiver: Receiver, clock: Clock,
        queued: list[Any]) -> None:
    org = make_org("Webhook School")
    admin = make_user(org, email="hooks-admin@example.test", username="")  # signs in with the email
    stack = make_stack(org, "alice")
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)
    page.get_by_role("link", name="Webhooks").click()
    checked(watched, "webhooks-empty")

    page.get_by_label("Endpoint URL").fill(receiver.url)
    page.get_by_label("Description").fill("Student information system")
    page.get_by_label("All events (*), including kinds added later").uncheck()
    page.get_by_label("memory.forgotten").check()
    page.get_by_role("button", name="Add endpoint").click()
    checked(watched, "webhooks-secret-shown", status=201)
    assert page.locator("#webhook-secret").inner_text().startswith("whsec_")

    endpoint = WebhookEndpoint.objects.get(organization=org)
    assert endpoint.event_types == ["memory.forgotten"]
    receiver.codes = [500]
    dispatch.fan_out(change_event(stack, 1, action="forget"))
    run(endpoint, stack)  # one failed attempt: the log shows a pending retry
    page.get_by_role("link", name=f"Delivery log of {endpoint.url}").click()
    checked(watched, "webhook-log")
    page.get_by_role("button", name="Send test event").click()
    checked(watched, "webhook-log-test-queued")
    run(endpoint, None)
    page.reload()
    checked(watched, "webhook-log-after-test")
    assert [b["type"] for b in receiver.bodies()] == ["memory.forgotten", "webhook.test"]

    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False, disabled_reason="failing",
                                                          disabled_at=clock.now)
    page.goto(f"{dashboard_url}/dashboard/webhooks/")
    checked(watched, "webhooks-needs-attention")
    assert page.get_by_role("heading", name="Needs attention").is_visible()
