"""The billing page: a school's plan and what it uses now, for admins and billing users — and for
a billing user, nothing else of the dashboard."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone
from eth_account import Account
from eth_account.messages import encode_defunct

from accounts.models import Membership, Organization
from accounts.tiers import MB
from billing.models import Payment, Subscription, Wallet
from memories.services import memory_create
from stacks.models import Stack
from tests.actors import School
from tests.billing.chain import USDC, DevChain
from tests.billing.conftest import chain, dev_chain_node  # noqa: F401 - the chain fixtures
from tests.billing.test_payments import Payer, now_on_chain
from tests.dashboard.pages import client_for
from tests.factories import make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

URL = "/dashboard/billing/"


def chart(page: str) -> dict[str, Any]:
    spec = re.search(r'<script id="chart-usage" type="application/json">(.*?)</script>', page, re.S)
    assert spec is not None
    return json.loads(spec.group(1))


def test_an_admin_sees_the_plan_and_usage_measured_as_billing_enforces_it(school: School) -> None:
    # The cast's school is on "pro": 10 active stacks, 1 GB. Two active stacks, one archived.
    make_stack(school.org, "gone", status=Stack.Status.ARCHIVED)
    memory_create(stack=school.stack, kind="note", payload={"content": "Fractions click with pizza"}, source="api")
    memory_create(stack=school.other_stack, kind="note", payload={"content": "Likes maps"}, source="api")
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=300 * MB)

    response = client_for(school.admin).get(URL)

    assert response.status_code == 200
    page = response.content.decode()
    assert re.search(r'id="plan-name">Pro<', page)
    assert re.search(r'id="usage-stacks">2 <span class="stat-label">of 10</span>', page)
    assert "1 archived stack (not counted)" in page
    assert re.search(r'id="usage-storage">300\.0\s*MB <span class="stat-label">of 1 GB</span>', page)
    assert re.search(r'id="usage-memories">2<', page)
    spec = chart(page)
    assert spec["labels"][0] == ["Active stacks", "2 of 10 · 20%"] and spec["labels"][1][0] == "Storage"
    used, free = spec["datasets"]
    assert used["label"] == "In use" and used["data"][0] == 20.0 and 29 < used["data"][1] < 30
    assert free["label"] == "Still free" and free["data"][0] == 80.0 and 70 < free["data"][1] < 71
    # Every plan a school can be on, to compare; the school's own marked. No chain configured in
    # this test: nothing to pay with, so no form.
    for name in ("free", "core", "pro", "enterprise"):
        assert f'data-tier="{name}"' in page
    assert 'data-tier="unlimited"' not in page
    assert re.search(r'data-tier="pro">.*?your plan', page, re.S)
    # Each plan's price and what growth past its limits costs (§12.7), to decide between them.
    assert re.search(r'data-tier="core">.*?>5 USDC<.*?1\.5 USDC per extra stack, 0\.5 per extra GB', page, re.S)
    assert re.search(r'data-tier="free">.*?>free<.*?refused past the limits', page, re.S)
    assert re.search(r'data-tier="enterprise">.*?>by contract<', page, re.S)
    assert "USDC" in page and "<form" not in page.split('id="content"')[1]
    # A school's usage, never a student's name.
    assert school.stack.slug not in page and "Fractions" not in page


def test_a_school_at_its_limits_is_told_so(db: None) -> None:
    org = make_org(tier="free")
    admin = make_user(org)
    make_stack(org, "only", bytes_used=11 * MB)
    page = client_for(admin).get(URL).content.decode()
    assert page.count('class="badge danger"') == 2
    assert "New students cannot be added" in page and "new memories are refused" in page


def test_a_new_schools_empty_plan_reads_as_all_free_not_as_a_blank_chart(db: None) -> None:
    """0 bytes of 10 MB: the chart drew a full-height limit bar and no usage at all. Each limit is
    now one bar of what is in use and what is still free, the numbers in its label."""
    org = make_org(tier="free")
    page = client_for(make_user(org)).get(URL).content.decode()
    spec = chart(page)
    assert spec["labels"] == [["Active stacks", "0 of 1 · 0%"], ["Storage", "0\xa0bytes of 10 MB · 0%"]]
    assert [(d["label"], d["data"]) for d in spec["datasets"]] == [("In use", [0.0, 0.0]),
                                                                   ("Still free", [100.0, 100.0])]
    assert spec["max"] == 100.0 and 'data-billing-chart="chart-usage"' in page
    assert "Storage 0\xa0bytes of 10 MB · 0%" in page  # the canvas's text alternative says it too


def test_overflow_billed_past_a_limit_is_its_own_part_of_the_bar(db: None) -> None:
    org = make_org(tier="core")
    for slug in ("a", "b", "c"):
        make_stack(org, slug)
    Subscription.objects.create(organization=org, tier="core", status=Subscription.Status.ACTIVE, auto_renew=True,
                                starts_at=timezone.now(), renews_at=timezone.now() + timedelta(days=30))
    Organization.objects.filter(pk=org.pk).update(overflow_tier="core")  # as a confirmed payment leaves it
    org.refresh_from_db()
    make_stack(org, "d")  # a fourth stack on core: billed, not refused
    page = client_for(make_user(org)).get(URL).content.decode()
    assert re.search(r'id="plan-renewal">Renews on [^<]* for 6\.5 USDC', page)  # 5 + one extra stack at 1.50
    spec = chart(page)
    assert spec["labels"][0] == ["Active stacks", "4 of 3 · 133.3%"] and spec["max"] == 133.3
    assert [(d["label"], d["data"][0]) for d in spec["datasets"]] == [
        ("In use", 100.0), ("Still free", 0.0), ("Past the limit (billed)", 33.3)]


def test_an_unlimited_plan_has_no_gauge_and_no_chart(db: None) -> None:
    org = make_org(tier="enterprise")
    admin = make_user(org)
    make_stack(org, "one")
    page = client_for(admin).get(URL).content.decode()
    assert "No limit on your plan." in page and "<meter" not in page and "chart-usage" not in page


def test_an_unmapped_tier_is_a_503_page_not_a_guess(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="platinum")
    response = client_for(school.admin).get(URL)
    assert response.status_code == 503


def test_who_may_see_it(school: School, other_school: School) -> None:
    billing = make_user(school.org, role=Membership.Role.BILLING)
    page = client_for(billing).get(URL).content.decode()
    assert school.org.name in page and other_school.org.name not in page
    assert client_for(school.teacher).get(URL).status_code == 404
    assert Client().get(URL).status_code == 302


# --- a billing user sees the billing page and nothing else ----------------------------------------

# Pages for anyone signed in (or about to be), not dashboard pages of a role.
FOR_EVERYONE = {"billing", "password-change", "invitation-accept"}
FOR_EVERYONE_PREFIXES = ("password-reset", "login", "logout", "billing")  # billing-*: the billing page's own


def _dashboard_routes() -> list[tuple[str, list[str]]]:
    """(URL name, its keyword arguments) of every dashboard route, as dashboard/urls.py lists them."""
    from dashboard import urls

    routes: list[tuple[str, list[str]]] = []

    def walk(patterns: list[URLPattern | URLResolver]) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns)
            elif pattern.name:
                routes.append((pattern.name, list(pattern.pattern.regex.groupindex)))

    walk(urls.urlpatterns)
    return routes


def test_every_other_dashboard_page_is_a_404_for_a_billing_user(school: School) -> None:
    from memories.models import Memory

    memory = memory_create(stack=school.stack, kind="note", payload={"content": "x"}, source="api")
    billing = make_user(school.org, role=Membership.Role.BILLING)
    client = client_for(billing)
    # Real identifiers of this school, so a 404 is the role's refusal, not a missing object.
    values = {"slug": school.stack.slug, "memory_id": str(memory.pk), "action": "forget",
              "key_id": school.agent_key.public_id, "member_id": str(school.teacher.pk),
              "user_id": str(school.teacher.pk), "kind": "note"}
    checked = []
    for name, kwargs in _dashboard_routes():
        if name in FOR_EVERYONE or name.startswith(FOR_EVERYONE_PREFIXES):
            continue
        url = reverse(f"dashboard:{name}", kwargs={k: values.get(k, "x") for k in kwargs})
        statuses = {}
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            if name == "overview" and response.status_code == 302:
                assert response["Location"].endswith(URL)  # the overview sends billing users here
                continue
            statuses[method] = response.status_code
        # A page refuses a method it does not serve (405) before asking who is calling: that answer
        # is the same for every slug and every role, so it tells nothing. The method it serves: 404.
        assert set(statuses.values()) <= {404, 405} and (404 in statuses.values() or name == "overview"), \
            f"{url} answered {statuses}"
        checked.append(name)
    assert {"overview", "roster", "people", "keys", "audit", "student"} <= set(checked)
    assert Memory.objects.filter(pk=memory.pk, forgotten_at__isnull=True).exists()  # and nothing changed
    assert client.get(URL).status_code == 200
    # The navigation offers the billing page only.
    nav = client.get(URL).content.decode().split('aria-label="Main"')[1].split("</nav>")[0]
    assert re.findall(r'href="([^"]+)"', nav) == [URL]


# --- paying, changing the plan and wallets (on the session's real Anvil node) -------------------------

def payment_id_of(response: Any) -> str:
    assert response.status_code == 302, response.content
    match = re.search(r"/dashboard/billing/payments/(pay_[0-9a-f]+)/$", response["Location"])
    assert match is not None, response["Location"]
    return match.group(1)


def test_a_billing_user_upgrades_pays_by_hash_and_manages_the_plan(chain: DevChain) -> None:  # noqa: F811
    payer = Payer(chain, chain.accounts[5])
    payer.link_wallet()
    web = client_for(payer.user)
    page = web.get(URL).content.decode()
    assert 'id="upgrade-button"' in page and payer.wallet.address in page and 'id="connect-wallet"' in page

    payment_id = payment_id_of(web.post("/dashboard/billing/upgrade", {"tier": "core"}))
    pay_page = web.get(f"/dashboard/billing/payments/{payment_id}/").content.decode()
    link = f"ethereum:{chain.usdc}@31337/transfer?address={chain.treasury.address}&amp;uint256={5 * USDC}"
    assert link in pay_page and "Send exactly 5 USDC" in pay_page
    assert re.search(r'<div class="qr" role="img" aria-label="QR code of the payment link"><svg', pay_page)
    assert f'data-amount="{5 * USDC}"' in pay_page and f'data-treasury="{chain.treasury.address}"' in pay_page

    now_on_chain(chain)
    tx_hash = chain.send_usdc(payer.wallet, chain.treasury.address, 5 * USDC)
    confirm = f"/dashboard/billing/payments/{payment_id}/confirm"
    pending = web.post(confirm, {"tx_hash": tx_hash}, follow=True).content.decode()
    assert "1 of 10 confirmations" in pending and "pending verification" in pending
    assert payer.tier() == "free"
    chain.confirm()
    confirmed = web.post(confirm, {"tx_hash": tx_hash}, follow=True).content.decode()
    assert "Payment confirmed: core is active." in confirmed and payer.tier() == "core"

    page = web.get(URL).content.decode()
    assert re.search(r'id="plan-name">Core<', page) and "Renews on" in page and "for 5 USDC" in page
    assert re.search(rf'data-payment="{payment_id}">.*?confirmed.*?{tx_hash[:10]}', page, re.S)
    assert "basescan" not in page  # no explorer on the development chain
    assert 'id="upgrade-button"' in page  # pro is still above
    # Downgrade, cancel, reactivate: forms that ask first, and the page says what will happen.
    assert page.count("data-confirm=") >= 3
    web.post("/dashboard/billing/downgrade", {"tier": "free"})
    assert "Moves to Free on" in web.get(URL).content.decode()
    web.post("/dashboard/billing/cancel")
    page = web.get(URL).content.decode()
    assert "Active until" in page and "Reactivate" in page
    web.post("/dashboard/billing/reactivate")
    assert Subscription.objects.get(organization=payer.org).status == "active"
    # A refused change is an error page with the reason, never a 500.
    again = web.post("/dashboard/billing/reactivate")
    assert again.status_code == 400 and "can be reactivated" in again.content.decode()
    bad_hash = web.post(confirm, {"tx_hash": "0x123"})
    assert bad_hash.status_code == 400


def test_connect_wallet_message_links_by_signature_and_unlink_removes_it(chain: DevChain) -> None:  # noqa: F811
    payer = Payer(chain, chain.accounts[6])
    web = client_for(payer.user)
    answer = web.post("/dashboard/billing/wallets/message", {"address": payer.wallet.address.lower()})
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    message = answer.json()["message"]
    assert payer.wallet.address in message and "Chain ID: 31337" in message  # EIP-55, from lowercase
    signature = Account.from_key(payer.wallet.key).sign_message(encode_defunct(text=message)).signature.hex()
    linked = payer.client.post("/api/v1/wallets/link", {"message": message, "signature": "0x" +
                                                        signature.removeprefix("0x")}, format="json")
    assert linked.status_code == 201, linked.content
    assert payer.wallet.address in web.get(URL).content.decode()
    assert web.post("/dashboard/billing/wallets/message", {"address": "0x12"}).status_code == 400
    web.post(f"/dashboard/billing/wallets/{payer.wallet.address}/unlink")
    assert not Wallet.objects.filter(organization=payer.org).exists()


def test_payment_history_is_paginated_with_explorer_links(school: School) -> None:
    from django.utils import timezone

    now = timezone.now()
    for n in range(12):
        Payment.objects.create(organization=school.org, tier="core", amount=5 * USDC, created_at=now,
                               expires_at=now, status="confirmed", chain_id=8453, tx_hash=f"0x{n:064x}",
                               log_index=0)
    web = client_for(school.admin)
    with override_settings(CHAIN_EXPLORER_URL="https://basescan.org"):
        first = web.get(URL).content.decode()
        second = web.get(URL + "?page=2").content.decode()
    assert first.count("data-payment=") == 10 and second.count("data-payment=") == 2
    assert "Page 1 of 2" in first and f'href="https://basescan.org/tx/0x{0:064x}"' in second + first
    assert web.get(URL + "?page=abc").status_code == 200  # a bad page number shows the first page


def test_another_schools_payments_and_wallets_are_404(chain: DevChain, school: School,  # noqa: F811
                                                       other_school: School) -> None:
    from django.utils import timezone

    now = timezone.now()
    theirs = Payment.objects.create(organization=other_school.org, tier="core", amount=5 * USDC, created_at=now,
                                    expires_at=now + timedelta(hours=24))
    wallet = Wallet.objects.create(organization=other_school.org, address=chain.accounts[7].address, linked_at=now)
    web = client_for(school.admin)
    for method, url in (("get", f"/dashboard/billing/payments/{theirs.public_id}/"),
                        ("post", f"/dashboard/billing/payments/{theirs.public_id}/confirm"),
                        ("post", f"/dashboard/billing/wallets/{wallet.address}/unlink")):
        response = getattr(web, method)(url, {"tx_hash": "0x" + "1" * 64} if "confirm" in url else {})
        assert response.status_code == 404, url
        assert other_school.org.name not in response.content.decode()
    assert Wallet.objects.filter(pk=wallet.pk).exists()
    assert Payment.objects.get(pk=theirs.pk).status == "pending"
    # A teacher of the school sees none of it, not even its own school's payment.
    mine = Payment.objects.create(organization=school.org, tier="core", amount=5 * USDC, created_at=now,
                                  expires_at=now + timedelta(hours=24))
    teacher = client_for(school.teacher)
    for method, url in (("get", URL), ("get", f"/dashboard/billing/payments/{mine.public_id}/"),
                        ("post", "/dashboard/billing/upgrade"), ("post", "/dashboard/billing/cancel"),
                        ("post", "/dashboard/billing/wallets/message")):
        assert getattr(teacher, method)(url).status_code == 404, url
    assert Payment.objects.filter(organization=school.org).count() == 1
