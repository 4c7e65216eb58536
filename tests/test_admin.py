"""The Django admin at /admin/: every model registered, every list and change page opens for a
superuser, no page ever shows a key hash or an embedding, memories cannot be written there, and
people who are not staff (a school admin included) are sent to the admin's sign-in, which locks
like the dashboard's and shares its state (accounts/signin.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Group
from django.db.models import Model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.authors import Path, author_of
from accounts.invitations import invitation_create
from accounts.models import ApiKey, AuditEvent, Invitation, Organization, User
from accounts.principal import Principal
from billing.models import ChainCursor, Payment, SiweNonce, Subscription, Wallet
from memories.governance.erasure import memory_erase_request
from memories.models import (
    DeploymentEmbeddingModel,
    JobRun,
    Memory,
    MemorySalience,
    SyncWatermark,
)
from memories.reads.access_log import AccessPath, record_access
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_create, memory_update
from stacks.models import GuardianLink, GuardianRequest, StackConsent
from teleport.models import Snapshot, TeleportCode
from tests.actors import School
from tests.factories import make_user
from webhooks.models import WebhookDelivery
from webhooks.services import endpoint_create

pytestmark = pytest.mark.django_db

# A vector component no page may print (the admin would render the vector as a list of floats).
EMBEDDING_MARK = 0.8765432
# An address redaction takes out of a raw entry: only its sealed original holds it, and no page opens that.
SEALED_MARK = "sealed.original@example.org"


@pytest.fixture
def everything(school: School, settings: Any) -> dict[str, Any]:
    """One row at least of every registered model, made through the services where there is one."""
    settings.WEBHOOKS_ALLOW_LOOPBACK_HTTP = True  # the endpoint below is never called
    Group.objects.create(name="operators")
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "Fractions click with pizza"},
                           source="api", record_id="note-1")
    memory_update(memory=memory, payload={"content": "Fractions click with pizza diagrams"}, source="api")
    Memory.objects.filter(pk=memory.pk).update(embedding=[EMBEDDING_MARK] * 384, embedding_model="hash-v1/384")
    Organization.objects.filter(pk=school.org.pk).update(keep_raw_originals=True)  # a RawOriginal row
    memory_create(stack=school.stack, kind="raw", payload={"content": f"Mum: {SEALED_MARK}"}, source="api")
    MemorySalience.objects.create(memory=memory, salience=0.42, computed_at=timezone.now())
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions practice"))
    boot_config_set(stack=school.stack, key="tone", value="warm")
    JobRun.objects.create(name="decay", status=JobRun.Status.SUCCEEDED, counts={"forgotten": 1})
    DeploymentEmbeddingModel.objects.get_or_create(
        id=1, defaults={"model_id": "hash-v1/384", "recorded_at": timezone.now()})
    SyncWatermark.objects.create(stack=school.stack, credential_id=school.agent_key.public_id,
                                 pulled_at=timezone.now())
    doomed = memory_create(stack=school.stack, kind="note", payload={"content": "to erase"}, source="api")
    memory_erase_request(principal=Principal(user=school.admin, organization=school.org), memory=doomed,
                         requested_by="a parent's request")
    invitation_create(organization=school.org, email="new.teacher@example.test", role="teacher",
                      principal=Principal(user=school.admin, organization=school.org))
    endpoint, _ = endpoint_create(organization=school.org, url="http://127.0.0.1:9/hook", event_types=["*"])
    WebhookDelivery.objects.create(endpoint=endpoint, stack=school.stack, event_type="memory.created",
                                   data={"memory_ids": [str(memory.pk)]})
    # Billing and teleport rows as their services leave them (those services need a chain or an
    # upload; what the admin shows is the row).
    now = timezone.now()
    Subscription.objects.create(organization=school.org, tier="core", status="active", starts_at=now, renews_at=now)
    Wallet.objects.create(organization=school.org, address="0x" + "ab" * 20, linked_at=now)
    SiweNonce.objects.create(organization=school.org, nonce_hash="f" * 64, created_at=now, expires_at=now)
    Payment.objects.create(organization=school.org, tier="core", amount=5_000_000, created_at=now, expires_at=now)
    ChainCursor.objects.create(name="31337:treasury", last_block=7)
    snapshot = Snapshot.objects.create(stack=school.stack, blob_sha256="e" * 64, key_id="dev", stored_bytes=10,
                                       unpacked_bytes=10, file_count=1, created_at=now, expires_at=now)
    TeleportCode.objects.create(snapshot=snapshot, code_hash="d" * 64, created_at=now, expires_at=now)
    GuardianLink.objects.create(user=make_user(school.org, role="guardian"), stack=school.stack)
    StackConsent.objects.create(stack=school.stack, action="given", method="paper", by_user=school.admin)
    GuardianRequest.objects.create(organization=school.org, stack=school.stack, kind="deletion", scope="stack",
                                   due_at=now)
    reader = author_of(Principal(user=school.admin, organization=school.org), path=Path.API)
    record_access(stack_id=school.stack.pk, author=reader, path=AccessPath.GET, memory_ids=[memory.pk])
    return {"memory": memory}


def superuser_client() -> Client:
    user = make_user(None)
    User.objects.filter(pk=user.pk).update(is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def _admin_url(model: type[Model], view: str, *args: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_every_model_of_our_apps_is_registered() -> None:
    from django.apps import apps

    ours = {"accounts", "stacks", "billing", "memories", "webhooks", "dashboard", "teleport", "agents"}
    models = {m for m in apps.get_models() if m._meta.app_label in ours}
    missing = {m.__name__ for m in models if m not in admin.site._registry}
    assert not missing


def test_every_list_and_change_page_opens_and_never_shows_a_key_hash_or_an_embedding(
        school: School, everything: dict[str, Any]) -> None:
    client = superuser_client()
    hashes = [*ApiKey.objects.values_list("key_hash", flat=True),
              *Invitation.objects.values_list("token_hash", flat=True)]
    assert len(hashes) > 2
    opened = []
    for model in admin.site._registry:
        obj = model._default_manager.order_by("pk").first()
        assert obj is not None, f"the fixture made no {model.__name__}"
        for url in (_admin_url(model, "changelist"), _admin_url(model, "change", obj.pk)):
            response = client.get(url)
            assert response.status_code == 200, f"{url} answered {response.status_code}"
            page = response.content.decode()
            assert not any(h in page for h in hashes), f"{url} shows a key or token hash"
            assert str(EMBEDDING_MARK) not in page, f"{url} shows an embedding"
            assert SEALED_MARK not in page and 'name="ciphertext"' not in page, f"{url} shows a sealed original"
            assert 'name="embedding"' not in page and "search_vector" not in page
        opened.append(model.__name__)
    assert {"Memory", "MemoryRevision", "ApiKey", "ErasureCertificate", "Stack", "Organization"} <= set(opened)


def test_memories_are_read_only_there(school: School, everything: dict[str, Any]) -> None:
    client = superuser_client()
    memory = everything["memory"]
    page = client.get(_admin_url(Memory, "change", memory.pk)).content.decode()
    assert "Fractions click with pizza diagrams" in page  # the text is there to read
    assert '<textarea' not in page and 'name="text"' not in page and 'name="data"' not in page
    assert client.get(_admin_url(Memory, "add")).status_code == 403
    response = client.post(_admin_url(Memory, "change", memory.pk), {"text": "changed", "kind": "note"})
    assert response.status_code == 403
    assert client.post(_admin_url(Memory, "delete", memory.pk), {"post": "yes"}).status_code == 403
    memory.refresh_from_db()
    assert memory.text == "Fractions click with pizza diagrams"


def test_search_and_filters_answer_without_errors(school: School, everything: dict[str, Any]) -> None:
    client = superuser_client()
    for model in admin.site._registry:
        for query in ({"q": "not-a-uuid"}, {"q": school.stack.slug}):
            url = _admin_url(model, "changelist")
            assert client.get(url, query).status_code == 200, f"{url}?q={query['q']}"
    found = client.get(_admin_url(Memory, "changelist"), {"q": "note-1"}).content.decode()
    assert "note-1" in found


def test_a_school_admin_who_is_not_staff_is_sent_to_the_admin_sign_in(school: School) -> None:
    client = Client()
    client.force_login(school.admin)
    for url in ("/admin/", _admin_url(Memory, "changelist"), _admin_url(ApiKey, "changelist")):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


# --- signing in: the dashboard's lockout, one state for both pages -----------------------------------

PASSWORD = "correct horse battery staple"  # tests.factories.make_user's


def _staff(**fields: Any) -> User:
    user = make_user(None, **fields)
    User.objects.filter(pk=user.pk).update(is_staff=True, is_superuser=True)
    return user


def _admin_sign_in(username: str, password: str, ip: str = "192.0.2.10") -> Any:
    return Client(REMOTE_ADDR=ip).post("/admin/login/", {"username": username, "password": password,
                                                         "next": "/admin/"})


def _dashboard_sign_in(username: str, password: str, ip: str = "192.0.2.10") -> Any:
    return Client(REMOTE_ADDR=ip).post("/login/", {"username": username, "password": password})


def _signed_in(response: Any) -> bool:
    return "_auth_user_id" in response.wsgi_request.session


@pytest.mark.usefixtures("throttle_clock")
def test_wrong_admin_passwords_lock_the_account_and_the_right_one_then_gets_no_session() -> None:
    """Wrong passwords past the limit lock the account: the right one then gets no superuser session."""
    staff = _staff()
    statuses = [_admin_sign_in(staff.username, f"wrong-{n}").status_code for n in range(40)]
    limit = settings.AUTH_FAILURE_LIMITS["login_account"][0]
    assert statuses[:limit - 1] == [200] * (limit - 1) and set(statuses[limit - 1:]) == {429}
    right = _admin_sign_in(staff.username, PASSWORD, ip="192.0.2.99")  # from anywhere
    assert right.status_code == 429 and int(right["Retry-After"]) > 0
    assert "Too many failed sign-in attempts" in right.content.decode() and not _signed_in(right)
    assert AuditEvent.objects.filter(action="login.locked", target_id=staff.public_id,
                                     metadata__via="admin").exists()
    other = _staff()
    assert _admin_sign_in(other.username, PASSWORD).status_code == 302  # other accounts are unaffected


@pytest.mark.usefixtures("throttle_clock")
def test_the_admin_and_the_dashboard_share_one_lockout() -> None:
    """Each account fails from its own address and signs in from another: only the account's
    lock (not an address's) can refuse it."""
    limit = settings.AUTH_FAILURE_LIMITS["login_account"][0]
    first, second, third = _staff(), _staff(), _staff()
    # Locked on the dashboard: the admin refuses the right password too …
    for n in range(limit):
        _dashboard_sign_in(first.username, f"wrong-{n}", ip="192.0.2.21")
    refused = _admin_sign_in(first.username.upper(), PASSWORD, ip="192.0.2.99")  # names are case-folded
    assert refused.status_code == 429 and not _signed_in(refused)
    # … and the other way round.
    for n in range(limit):
        _admin_sign_in(second.username, f"wrong-{n}", ip="192.0.2.22")
    refused = _dashboard_sign_in(second.username, PASSWORD, ip="192.0.2.99")
    assert refused.status_code == 429 and not _signed_in(refused)
    # Failures on both pages count together: half here, half there lock the account.
    for n in range(limit):
        sign_in = _admin_sign_in if n % 2 else _dashboard_sign_in
        sign_in(third.username, f"wrong-{n}", ip="192.0.2.23")
    assert _admin_sign_in(third.username, PASSWORD, ip="192.0.2.99").status_code == 429
    assert _dashboard_sign_in(third.username, PASSWORD, ip="192.0.2.99").status_code == 429
    assert _admin_sign_in(_staff().username, PASSWORD, ip="192.0.2.99").status_code == 302


@pytest.mark.usefixtures("throttle_clock")
def test_wrong_admin_passwords_from_one_ip_lock_that_ip_on_both_pages(school: School) -> None:
    staff = _staff()
    for n in range(settings.AUTH_FAILURE_LIMITS["login_ip"][0]):
        _admin_sign_in(f"someone{n}@example.test", "wrong", ip="192.0.2.50")
    assert _admin_sign_in(staff.username, PASSWORD, ip="192.0.2.50").status_code == 429
    assert _dashboard_sign_in(school.teacher.username, PASSWORD, ip="192.0.2.50").status_code == 429
    signed_in = _admin_sign_in(staff.username, PASSWORD, ip="192.0.2.51")
    assert signed_in.status_code == 302 and signed_in["Location"] == "/admin/" and _signed_in(signed_in)
    assert AuditEvent.objects.filter(action="login.succeeded", target_id=staff.public_id,
                                     metadata__via="admin").exists()
