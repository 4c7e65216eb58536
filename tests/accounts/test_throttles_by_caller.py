"""Budgets by who is asking, not by address (docs/kernle-protocol.md §2.9).

Authenticated requests are counted per credential and per school, never per client IP: a school's
devices behind one NAT address, or a tutor vendor's agents on a few servers, each keep their own
budget. Requests without a valid credential are still counted per client IP, and failed
credentials still cost their address. Every client here comes from the test client's one address
(127.0.0.1). Throttle windows run on the pinned clock (conftest `throttle_clock`); the counters are
real Redis."""

from __future__ import annotations

import copy
from secrets import token_hex
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from accounts.models import Organization
from accounts.throttles import parse_rate
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_clock")]

ADDRESS = "127.0.0.1"


def rates(**scoped: str) -> dict[str, Any]:
    rest: dict[str, Any] = copy.deepcopy(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"].update(scoped)
    return rest


def agent_secrets(org: Organization, count: int) -> list[tuple[str, str]]:
    """`count` agents of `org`, each with its own stack and that stack's agent key: (slug, secret)."""
    agents = []
    for n in range(count):
        stack = make_stack(org, f"agent-{org.pk}-{n}")
        _, secret = make_key(org, stack=stack)
        agents.append((stack.slug, secret))
    return agents


def push(secret: str, stack_id: str) -> Any:
    return bearer_client(secret).post("/sync/push", {"stack_id": stack_id, "operations": []}, format="json",
                                      REMOTE_ADDR=ADDRESS)


def test_16_keys_behind_one_address_each_keep_their_own_push_budget() -> None:
    agents = agent_secrets(make_org(tier="unlimited"), 16)
    with override_settings(REST_FRAMEWORK=rates(sync_push="3/min")):
        # 48 pushes from one address within one minute, 16 times the per-address rate: all served.
        statuses = [push(secret, slug).status_code for _ in range(3) for slug, secret in agents]
        assert statuses == [200] * 48
        # Each key's own budget still holds: its 4th push is refused, with when to come back.
        refused = push(agents[0][1], agents[0][0])
        assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
        assert refused.json()["error"]["code"] == "throttled"


def test_anonymous_routes_are_still_limited_per_address() -> None:
    agents = agent_secrets(make_org(), 2)
    with override_settings(REST_FRAMEWORK=rates(sync_push="3/min")):
        for slug, secret in agents:  # keys busy at the address cost the anonymous budget nothing
            assert [push(secret, slug).status_code for _ in range(3)] == [200] * 3
    registered = [APIClient().post("/auth/register", {"stack_id": f"newcomer-{n}"}, format="json",
                                   REMOTE_ADDR=ADDRESS).status_code for n in range(6)]
    assert registered == [201] * 5 + [429]
    # Another address has its own.
    assert APIClient().post("/auth/register", {"stack_id": "elsewhere"}, format="json",
                            REMOTE_ADDR="203.0.113.20").status_code == 201


@override_settings(THROTTLE_SCHOOL_RATE="5/min")
def test_a_school_past_its_share_is_refused_while_another_school_is_served() -> None:
    busy = make_org(tier="free")  # a share of 1: THROTTLE_SCHOOL_RATE itself
    busy_keys = [make_key(busy)[1] for _ in range(3)]
    _, other_key = make_key(make_org())
    served = [bearer_client(busy_keys[n % 3]).get("/api/v1/stacks/", REMOTE_ADDR=ADDRESS).status_code
              for n in range(5)]
    assert served == [200] * 5
    for secret in busy_keys:  # every key of that school, though none used its own budget
        refused = bearer_client(secret).get("/api/v1/stacks/", REMOTE_ADDR=ADDRESS)
        assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
        assert refused.json()["error"]["code"] == "throttled"
    # The school's share covers its sync pushes too.
    slug, secret = agent_secrets(busy, 1)[0]
    assert push(secret, slug).status_code == 429
    # Another school at the same address is served.
    assert bearer_client(other_key).get("/api/v1/stacks/", REMOTE_ADDR=ADDRESS).status_code == 200


@override_settings(THROTTLE_SCHOOL_RATE="5/min")
@pytest.mark.parametrize(("tier", "share"), [("core", 10), ("pro", 20)])
def test_a_schools_share_grows_with_its_plan(tier: str, share: int) -> None:
    org = make_org(tier=tier)
    keys = [make_key(org)[1] for _ in range(4)]
    statuses = [bearer_client(keys[n % 4]).get("/api/v1/stacks/").status_code for n in range(share + 1)]
    assert statuses == [200] * share + [429]


@override_settings(THROTTLE_SCHOOL_RATE="5/min")
def test_the_operators_unlimited_plan_has_no_school_budget() -> None:
    org = make_org(tier="unlimited")
    keys = [make_key(org)[1] for _ in range(4)]
    assert {bearer_client(keys[n % 4]).get("/api/v1/stacks/").status_code for n in range(30)} == {200}


@override_settings(AUTH_FAILURE_LIMITS={**settings.AUTH_FAILURE_LIMITS, "bearer_ip": (5, 600, 300)})
def test_failed_credentials_are_still_limited_per_address() -> None:
    statuses = [push(f"knl_sk_{token_hex(16)}", "anything").status_code for _ in range(8)]
    assert statuses == [401] * 5 + [429] * 3
    # Another address is not blocked by this one's failures.
    elsewhere = bearer_client(f"knl_sk_{token_hex(16)}").post(
        "/sync/push", {"stack_id": "anything", "operations": []}, format="json", REMOTE_ADDR="203.0.113.21")
    assert elsewhere.status_code == 401


def test_16_keys_at_one_address_get_their_full_push_budgets_at_the_default_rates() -> None:
    """The default rates, as served: one address's 16 agents get 16 per-key budgets, not one."""
    agents = agent_secrets(make_org(tier="unlimited"), 16)
    rates_now: dict[str, str] = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]  # type: ignore[assignment]
    limit, _ = parse_rate(rates_now["sync_push"])
    served = sum(push(secret, slug).status_code == 200 for _ in range(limit) for slug, secret in agents)
    assert served == 16 * limit
    assert push(agents[-1][1], agents[-1][0]).status_code == 429
