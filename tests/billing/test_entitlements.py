"""Tier limits and the entitlements interface other apps ask."""

from __future__ import annotations

import pytest

from accounts.models import Organization
from accounts.tiers import MB, TIERS
from billing import entitlements
from memoryhub.errors import QuotaExceeded, ServiceUnavailable
from stacks.models import Stack
from stacks.selectors import stack_room
from tests.billing.chain import DevChain
from tests.billing.test_payments import Payer
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db


def test_tier_table_maps_every_tier_explicitly() -> None:
    assert TIERS["free"].storage_bytes == 10 * MB and TIERS["free"].syncing_stacks == 1
    assert TIERS["core"].syncing_stacks == 3 and TIERS["pro"].syncing_stacks == 10
    assert TIERS["enterprise"].storage_bytes is None and TIERS["enterprise"].syncing_stacks is None


def test_storage_is_counted_per_organization_across_stacks() -> None:
    org = make_org()
    make_stack(org, bytes_used=6 * MB)
    stack = make_stack(org, bytes_used=3 * MB)
    org.tier = "free"  # downgraded after making two stacks (the free tier would not create a second)
    org.save()
    make_stack(make_org(), bytes_used=9 * MB)  # another school's usage does not count
    assert entitlements.storage_used(organization=org) == 9 * MB
    assert entitlements.storage_used(organization=make_org()) == 0  # no stacks yet
    assert entitlements.storage_remaining(organization=org) == 1 * MB
    entitlements.ensure_can_store(stack=stack, additional_bytes=1 * MB)
    with pytest.raises(QuotaExceeded) as excinfo:
        entitlements.ensure_can_store(stack=stack, additional_bytes=1 * MB + 1)
    assert excinfo.value.code == "storage_quota_exceeded"
    assert excinfo.value.fields["limit"] == "storage_bytes" and "free: 10 MB" in excinfo.value.message
    entitlements.ensure_can_store(stack=stack, additional_bytes=-5)  # shrinking is always allowed


def test_stack_limit_counts_active_stacks() -> None:
    org = make_org(tier="free")
    entitlements.ensure_can_create_stack(organization=org)
    make_stack(org)
    with pytest.raises(QuotaExceeded) as excinfo:
        entitlements.ensure_can_create_stack(organization=org)
    assert excinfo.value.fields["limit"] == "syncing_stacks"
    assert "stack limit reached (free: 1 syncing stack)" in excinfo.value.message
    Stack.objects.filter(organization=org).update(status=Stack.Status.ARCHIVED)
    entitlements.ensure_can_create_stack(organization=org)


def test_unlimited_tier_and_unknown_tier_fails_closed() -> None:
    org = make_org()
    org.tier = "enterprise"
    org.save()
    stack = make_stack(org, bytes_used=10**12)
    entitlements.ensure_can_store(stack=stack, additional_bytes=10**12)
    entitlements.ensure_can_create_stack(organization=org)
    org.tier = "admin"
    org.save()
    with pytest.raises(ServiceUnavailable):
        entitlements.ensure_can_store(stack=stack, additional_bytes=1)


def test_a_confirmed_core_payment_lets_stacks_past_the_count_in_and_bills_them(chain: DevChain) -> None:
    """The stack quota sits in stacks, below billing: a payment confirmed on the chain must reach it
    (Organization.overflow_tier, written with the tier), so the fourth stack on core is accepted and
    priced at §12.7's 1.50 USDC, where free refused the second."""
    payer = Payer(chain, chain.accounts[0])
    make_stack(payer.org, "first")
    with pytest.raises(QuotaExceeded):
        entitlements.ensure_can_create_stack(organization=payer.org)
    payer.link_wallet()
    intent = payer.upgrade("core")
    tx_hash = payer.pay(intent)
    chain.confirm()
    assert payer.confirm(intent["payment_id"], tx_hash).json()["status"] == "confirmed"

    org = Organization.objects.get(pk=payer.org.pk)
    assert (org.tier, org.overflow_tier) == ("core", "core")
    for slug in ("second", "third", "fourth"):
        entitlements.ensure_can_create_stack(organization=org)
        make_stack(org, slug)
    assert stack_room(organization=org) is None
    estimate = entitlements.monthly_cost_estimate(organization=org, storage_bytes=0)
    assert (estimate["overflow"], estimate["total"], estimate["overflow_billed"]) == ("1.5", "6.5", True)
    me = payer.client.get("/api/v1/subscriptions/me").json()
    assert me["subscription"]["renewal_amount"] == "6.5" and me["usage"]["agents_used"] == 4
