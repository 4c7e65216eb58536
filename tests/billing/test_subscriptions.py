"""Subscriptions on a virtual clock (the lifecycle takes `now`): the renewal warning, grace, expiry
to free — after which writes over the free quota are refused with the documented error and reads
still work — scheduled downgrades, cancel and reactivate, overflow on a paid tier; who may manage
billing (admins and billing members), who may read it (agent keys too); one school never reaches
another's payments. The chain is not needed here: tests/billing/test_payments.py pays for real."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership, Organization
from accounts.tiers import GB, MB
from billing.models import Payment, Subscription
from billing.selectors import overflow_tier_for
from billing.services.lifecycle import LifecycleReport, lifecycle_run
from billing.services.subscriptions import one_month_after
from stacks.models import Stack
from stacks.selectors import stack_room
from stacks.services import personal_account_register
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import bearer_client, make_key, make_org, make_stack, make_user
from tests.memories.test_sync_kernle import episode

pytestmark = pytest.mark.django_db

# A chain configuration that names a treasury but whose node is not there: enough to open intents
# (no RPC call), and every chain call fails as it would with the node down.
Lifecycle = Callable[[datetime], LifecycleReport]
CHAIN_DOWN = {"CHAIN_RPC_URL": "http://127.0.0.1:9", "CHAIN_ID": 8453,
              "USDC_CONTRACT": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
              "TREASURY_ADDRESS": "0x1111111111111111111111111111111111111111", "CHAIN_RPC_TIMEOUT_SECONDS": 1}


def paid(org: Organization, tier: str, *, start: datetime) -> Subscription:
    """The state a confirmed payment leaves (test_payments.py covers getting there on a real chain)."""
    subscription = Subscription.objects.create(organization=org, tier=tier, status=Subscription.Status.ACTIVE,
                                               starts_at=start, renews_at=one_month_after(start),
                                               auto_renew=True)
    overflow = overflow_tier_for(subscription, organization_tier=tier)  # as billing.services.subscriptions writes it
    org.tier, org.overflow_tier = tier, overflow
    org.save(update_fields=["tier", "overflow_tier"])  # a save, whose signal resets the web's key cache
    return subscription


@pytest.fixture
def run(django_capture_on_commit_callbacks: Any) -> Lifecycle:
    """The daily lifecycle at `now`, with its after-commit effects (the emails) carried out."""

    def lifecycle(now: datetime) -> LifecycleReport:
        with django_capture_on_commit_callbacks(execute=True):
            return lifecycle_run(now=now)

    return lifecycle


def billing_member(school: School) -> APIClient:
    return csrf_session_client(make_user(school.org, role=Membership.Role.BILLING))


def push(client: APIClient, slug: str, record_id: str) -> Any:
    return client.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": [
        {"op": "upsert", "kind": "note", "record_id": record_id, "updated_at": "2026-11-21T23:00:00+00:00",
         "data": {"content": "Fractions need common denominators"}}]}, format="json")


def test_free_by_default_with_usage_as_the_protocol_shows_it(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="free")
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=3 * MB, last_sync_at=timezone.now())
    body = school.agent.get("/api/v1/subscriptions/me").json()
    assert body["subscription"] == {"tier": "free", "status": "active", "starts_at": None, "renews_at": None,
                                    "cancelled_at": None, "auto_renew": False, "renewal_amount": None,
                                    "scheduled_tier": None}
    usage = body["usage"]
    assert usage["storage_used"] == 3 * MB and usage["storage_limit"] == 10 * MB
    assert usage["agents_used"] == 2 and usage["agents_limit"] == 1 and usage["sync_count"] == 1
    assert usage["period"] == timezone.now().strftime("%Y-%m") and usage["last_sync"] is not None
    assert school.agent.get("/api/v1/usage/me").json() == {"usage": usage}


def test_lifecycle_warns_then_grace_then_free_and_writes_over_free_quota_are_refused(
        school: School, run: Lifecycle) -> None:
    start = timezone.now()
    subscription = paid(school.org, "pro", start=start)
    renews = subscription.renews_at
    assert renews is not None
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=50 * MB)  # fits pro (1 GB), not free (10 MB)

    assert run(renews - timedelta(days=4)).warned == 0
    warned = run(renews - timedelta(days=3) + timedelta(hours=1))
    assert warned.warned == 1
    renewal = Payment.objects.get(organization=school.org, kind=Payment.Kind.RENEWAL)
    assert renewal.status == "pending" and renewal.amount == 15_000_000 and renewal.tier == "pro"
    assert len(mail.outbox) == 1 and school.admin.email in mail.outbox[0].to
    assert "15 USDC" in mail.outbox[0].body and renewal.public_id in mail.outbox[0].body
    assert run(renews - timedelta(days=2)).warned == 0  # once per period

    assert run(renews + timedelta(hours=1)).grace == 1
    subscription.refresh_from_db()
    school.org.refresh_from_db()
    assert subscription.status == "grace_period" and school.org.tier == "pro"  # limits kept in grace
    assert push(school.agent, school.stack.slug, "in-grace").json()["applied"] == 1

    assert run(renews + timedelta(days=6)).expired == 0
    assert run(renews + timedelta(days=7, hours=1)).expired == 1
    subscription.refresh_from_db()
    school.org.refresh_from_db()
    assert (subscription.tier, subscription.status, school.org.tier) == ("free", "expired", "free")
    renewal.refresh_from_db()
    assert renewal.status == "expired"
    assert "free tier" in mail.outbox[-1].body

    refused = push(school.agent, school.stack.slug, "after-expiry")
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert error["code"] == "storage_quota_exceeded" and "free: 10 MB" in error["message"]
    pulled = school.agent.get(f"/api/v1/stacks/{school.stack.slug}/sync/pull")  # reads are still allowed
    assert pulled.status_code == 200 and [c["record_id"] for c in pulled.json()["changes"]] == ["in-grace"]
    me = school.agent.get("/api/v1/subscriptions/me").json()["subscription"]
    assert me["tier"] == "free" and me["status"] == "expired"
    assert AuditEvent.objects.filter(organization=school.org, action="billing.expired").exists()


def test_a_scheduled_downgrade_waits_for_the_end_of_the_period(school: School, run: Lifecycle) -> None:
    start = timezone.now()
    subscription = paid(school.org, "pro", start=start)
    renews = subscription.renews_at
    assert renews is not None
    client = billing_member(school)
    response = client.post("/api/v1/subscriptions/downgrade", {"tier": "core"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["current_tier"] == "pro" and body["new_tier"] == "core"
    assert body["effective_at"] == renews.isoformat()
    school.org.refresh_from_db()
    assert school.org.tier == "pro"  # nothing changes before the period ends
    assert client.get("/api/v1/subscriptions/me").json()["subscription"]["renewal_amount"] == "5"

    run(renews - timedelta(days=2))
    renewal = Payment.objects.get(organization=school.org, kind=Payment.Kind.RENEWAL)
    assert renewal.tier == "core" and renewal.amount == 5_000_000
    assert run(renews + timedelta(minutes=1)).downgraded == 1
    subscription.refresh_from_db()
    school.org.refresh_from_db()
    assert subscription.tier == "core" and school.org.tier == "core" and subscription.scheduled_tier == ""
    assert subscription.status == "grace_period"  # the core month is not paid yet


def test_a_downgrade_to_free_ends_the_plan_at_the_period_end(school: School, run: Lifecycle) -> None:
    subscription = paid(school.org, "core", start=timezone.now())
    renews = subscription.renews_at
    assert renews is not None
    assert billing_member(school).post("/api/v1/subscriptions/downgrade", {"tier": "free"},
                                       format="json").status_code == 200
    run(renews - timedelta(days=1))
    assert not Payment.objects.filter(organization=school.org).exists()  # nothing to pay for free
    assert "ends on" in mail.outbox[-1].body
    run(renews)
    subscription.refresh_from_db()
    school.org.refresh_from_db()
    assert (subscription.tier, subscription.status, school.org.tier) == ("free", "active", "free")


def test_downgrade_upgrade_rules_are_400s(school: School) -> None:
    client = billing_member(school)
    Organization.objects.filter(pk=school.org.pk).update(tier="free")
    for tier, code in (("free", "invalid_tier"), ("enterprise", "invalid_tier"), ("gold", None)):
        response = client.post("/api/v1/subscriptions/upgrade", {"tier": tier}, format="json")
        assert response.status_code == 400, tier
        if code:
            assert response.json()["error"]["code"] == code
    assert client.post("/api/v1/subscriptions/downgrade", {"tier": "core"}, format="json").json()["error"][
        "code"] == "not_downgradable"
    paid(school.org, "core", start=timezone.now())
    same = client.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json")
    assert same.status_code == 400 and same.json()["error"]["code"] == "not_an_upgrade"
    up = client.post("/api/v1/subscriptions/downgrade", {"tier": "pro"}, format="json")
    assert up.status_code == 400 and up.json()["error"]["code"] == "not_a_downgrade"
    assert not Payment.objects.exists()


def test_cancel_keeps_the_tier_until_the_period_ends_and_reactivate_undoes_it(school: School, run: Lifecycle) -> None:
    subscription = paid(school.org, "pro", start=timezone.now())
    renews = subscription.renews_at
    assert renews is not None
    client = billing_member(school)
    cancelled = client.post("/api/v1/subscriptions/cancel")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["active_until"] == renews.isoformat()
    assert client.post("/api/v1/subscriptions/cancel").status_code == 400
    reactivated = client.post("/api/v1/subscriptions/reactivate").json()
    assert reactivated["status"] == "active" and reactivated["auto_renew"] is True
    assert client.post("/api/v1/subscriptions/reactivate").status_code == 400
    assert client.post("/api/v1/subscriptions/cancel").status_code == 200
    assert run(renews - timedelta(days=2)).warned == 0  # no renewal is coming
    run(renews + timedelta(seconds=1))
    subscription.refresh_from_db()
    school.org.refresh_from_db()
    assert (subscription.tier, subscription.status, school.org.tier) == ("free", "expired", "free")


def test_a_paid_tier_with_overflow_accepts_and_bills_growth_past_its_limit(school: School) -> None:
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=1 * GB + 1)
    assert push(school.agent, school.stack.slug, "operator-pro").status_code == 402  # pro set by hand: hard limit
    paid(school.org, "pro", start=timezone.now())
    assert push(school.agent, school.stack.slug, "paid-pro").json()["applied"] == 1
    renewal = school.agent.get("/api/v1/subscriptions/me").json()["subscription"]["renewal_amount"]
    assert renewal == "15.5"  # 15 USDC + one started extra GB at 0.50


def test_teachers_and_agent_keys_cannot_manage_billing_but_agent_keys_can_read(school: School) -> None:
    paid(school.org, "core", start=timezone.now())
    teacher = csrf_session_client(school.teacher)
    assert teacher.get("/api/v1/subscriptions/me").status_code == 403
    for route, body in (("upgrade", {"tier": "pro"}), ("downgrade", {"tier": "free"}), ("cancel", None),
                        ("reactivate", None)):
        for client in (teacher, school.agent):
            response = client.post(f"/api/v1/subscriptions/{route}", body, format="json")
            assert response.status_code == 403, (route, response.content)
            assert response.json()["error"]["code"] == "billing_manager_required"
    _, read_only = make_key(school.org, user=school.admin, read_only=True)
    assert bearer_client(read_only).post("/api/v1/subscriptions/cancel").status_code == 403
    assert school.agent.get("/api/v1/subscriptions/me").json()["subscription"]["tier"] == "core"
    assert school.agent.get("/api/v1/subscriptions/payments").status_code == 200
    assert Subscription.objects.get(organization=school.org).status == "active"


def test_without_a_configured_chain_upgrade_fails_closed(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="free")
    response = school.admin_api.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json")
    assert response.status_code == 503 and response.json()["error"]["code"] == "billing_unavailable"
    assert response["Retry-After"]
    assert not Payment.objects.exists()


@override_settings(**CHAIN_DOWN)
def test_an_intent_for_24_hours_and_the_chain_down_is_a_503_on_payment_routes_only(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="free")
    client = billing_member(school)
    response = client.post("/api/v1/subscriptions/upgrade", {"tier": "pro"}, format="json")
    assert response.status_code == 201, response.content
    intent = response.json()
    assert intent["amount"] == "15" and intent["currency"] == "USDC" and intent["chain"] == "base"
    assert intent["treasury_address"] == CHAIN_DOWN["TREASURY_ADDRESS"] and intent["tier"] == "pro"
    assert intent["payment_link"] == (f"ethereum:{CHAIN_DOWN['USDC_CONTRACT']}@8453/transfer"
                                      f"?address={CHAIN_DOWN['TREASURY_ADDRESS']}&uint256=15000000")
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert payment.expires_at - payment.created_at == timedelta(hours=24)

    confirm = client.post("/api/v1/subscriptions/payments/confirm",
                          {"payment_id": payment.public_id, "tx_hash": "0x" + "ab" * 32}, format="json")
    assert confirm.status_code == 503 and confirm.json()["error"]["code"] == "chain_unavailable"
    assert confirm["Retry-After"]
    assert client.get("/api/v1/subscriptions/me").status_code == 200  # nothing else is affected
    payment.refresh_from_db()
    assert payment.status == "pending" and payment.tx_hash is None

    assert lifecycle_run(now=payment.expires_at).intents_expired == 1
    late = client.post("/api/v1/subscriptions/payments/confirm",
                       {"payment_id": payment.public_id, "tx_hash": "0x" + "ab" * 32}, format="json")
    assert late.status_code == 400 and late.json()["error"]["code"] == "payment_expired"


@override_settings(**CHAIN_DOWN)
def test_another_schools_payment_is_a_404_and_lists_are_per_school(school: School, other_school: School) -> None:
    Organization.objects.filter(pk__in=[school.org.pk, other_school.org.pk]).update(tier="free")
    theirs = other_school.admin_api.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json").json()
    response = school.admin_api.post("/api/v1/subscriptions/payments/confirm",
                                     {"payment_id": theirs["payment_id"], "tx_hash": "0x" + "cd" * 32}, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "payment_not_found"
    assert school.admin_api.get("/api/v1/subscriptions/payments").json()["total"] == 0
    listed = other_school.agent.get("/api/v1/subscriptions/payments").json()
    assert listed["total"] == 1 and listed["payments"][0]["id"] == theirs["payment_id"]
    assert listed["payments"][0]["status"] == "pending" and listed["payments"][0]["amount"] == "5"


@override_settings(**CHAIN_DOWN)
def test_payments_page_with_per_page_or_its_legacy_alias_limit(school: School) -> None:
    org = make_org(tier="free")
    admin = make_user(org, role=Membership.Role.ADMIN)
    client = csrf_session_client(admin)
    for _ in range(3):
        assert client.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json").status_code == 201
    first = client.get("/api/v1/subscriptions/payments?per_page=2").json()
    assert first["total"] == 3 and len(first["payments"]) == 2 and first["page"] == 1
    second = client.get("/api/v1/subscriptions/payments?page=2&limit=2").json()
    assert len(second["payments"]) == 1 and second["per_page"] == 2
    assert {p["id"] for p in first["payments"] + second["payments"]} == set(
        Payment.objects.filter(organization=org).values_list("public_id", flat=True))
    assert client.get("/api/v1/subscriptions/payments?page=0").status_code == 400


def kernle_push(client: APIClient, stack_id: str, record_id: str) -> dict[str, Any]:
    response = client.post("/sync/push", {"stack_id": stack_id, "operations": [episode(record_id)]}, format="json")
    assert response.status_code == 200, response.content  # a refused stack is a conflict, never a 4xx
    return dict(response.json())


def test_stacks_past_the_count_are_billed_on_core_and_refused_again_once_the_plan_lapses(
        school: School, run: Lifecycle) -> None:
    """§12.6-12.7: a paid tier with overflow prices in good standing accepts a stack past its count
    and bills it; free refuses it; grace and expiry refuse new ones again, existing ones keep working."""
    Organization.objects.filter(pk=school.org.pk).update(tier="free")
    school.org.refresh_from_db()
    refused = school.admin_api.post("/api/v1/stacks/", {"stack_id": "third"}, format="json")
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "stack_limit_reached"

    subscription = paid(school.org, "core", start=timezone.now())
    renews = subscription.renews_at
    assert renews is not None
    for slug in ("third", "fourth"):  # core counts 3 syncing stacks; the fourth is billed at 1.50
        created = school.admin_api.post("/api/v1/stacks/", {"stack_id": slug}, format="json")
        assert created.status_code == 201, created.content
    assert stack_room(organization=school.org) is None  # a roster import is not refused either
    assert billing_member(school).get("/api/v1/subscriptions/me").json()["subscription"]["renewal_amount"] == "6.5"
    cost = school.admin_api.get("/api/v1/stacks/alice/usage").json()["organization"]["cost_now"]
    assert (cost["price"], cost["overflow"], cost["total"], cost["overflow_billed"]) == ("5", "1.5", "6.5", True)
    run(renews - timedelta(days=2))
    renewal = Payment.objects.get(organization=school.org, kind=Payment.Kind.RENEWAL)
    assert renewal.amount == 6_500_000  # billed at renewal

    assert run(renews + timedelta(hours=1)).grace == 1  # unpaid: the hard limit is back for new stacks
    again = school.admin_api.post("/api/v1/stacks/", {"stack_id": "fifth"}, format="json")
    assert again.status_code == 402 and "core: 3 syncing stacks" in again.json()["error"]["message"]
    school.org.refresh_from_db()
    assert stack_room(organization=school.org) == 0
    assert push(school.agent, school.stack.slug, "in-grace").json()["applied"] == 1  # existing stacks sync on

    run(renews + timedelta(days=7, hours=1))
    school.org.refresh_from_db()
    assert (school.org.tier, school.org.overflow_tier) == ("free", "")
    expired = school.admin_api.post("/api/v1/stacks/", {"stack_id": "fifth"}, format="json")
    assert expired.status_code == 402 and "free: 1 syncing stack" in expired.json()["error"]["message"]
    assert Stack.objects.filter(organization=school.org, status=Stack.Status.ACTIVE).count() == 4


def test_kernle_first_push_past_the_stack_count_is_accepted_on_core_and_a_conflict_after_a_downgrade(
        run: Lifecycle) -> None:
    reg = personal_account_register(stack_id="first", email="overflow-agent@example.test")
    org = reg.organization
    client = bearer_client(make_key(org, user=reg.user)[1])  # the account's unbound key provisions stacks
    free = kernle_push(client, "second", "e1")
    assert free["synced"] == 0 and "stack limit reached (free: 1 syncing stack)" in free["conflicts"][0]["error"]

    subscription = paid(org, "core", start=timezone.now())
    renews = subscription.renews_at
    assert renews is not None
    for slug in ("second", "third", "fourth"):
        assert kernle_push(client, slug, f"{slug}-1")["synced"] == 1
    assert Stack.objects.filter(organization=org, status=Stack.Status.ACTIVE).count() == 4
    owner = csrf_session_client(reg.user)
    assert owner.get("/api/v1/subscriptions/me").json()["subscription"]["renewal_amount"] == "6.5"

    assert owner.post("/api/v1/subscriptions/downgrade", {"tier": "free"}, format="json").status_code == 200
    assert kernle_push(client, "fifth", "e2")["synced"] == 1  # still core, in good standing, until renews_at
    run(renews)
    refused = kernle_push(client, "sixth", "e3")
    assert refused["synced"] == 0 and "stack limit reached (free: 1 syncing stack)" in refused["conflicts"][0]["error"]
    assert not Stack.objects.filter(organization=org, slug="sixth").exists()
    assert kernle_push(client, "second", "second-2")["synced"] == 1  # existing stacks keep syncing


def test_overflow_is_not_billed_for_a_tier_set_by_hand(db: None) -> None:
    org = make_org(tier="core")
    make_stack(org, "a")
    make_stack(org, "b")
    make_stack(org, "c")
    assert stack_room(organization=org) == 0  # core without a subscription: hard limit
    paid(org, "core", start=timezone.now())
    assert stack_room(organization=org) is None
    Organization.objects.filter(pk=org.pk).update(tier="free")  # an operator's hand, not billing's
    org.refresh_from_db()
    assert org.overflow_tier == "core" and not org.overflow_billed and stack_room(organization=org) == 0
