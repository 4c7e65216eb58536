"""Attacks on credentials and access, each reproduced and refused (docs/security.md §1-§2):

* a token is bound to its key and that key's person, school, stack and scope: a correctly
  signed token naming another key, school, stack or scope is a 401;
* access dies with its grant: a teacher's key stops working when the assignment ends,
  teachers issue and cycle keys only when their school allows it, and never receive the secret
  of a key issued to someone else;
* `X-Forwarded-For` from an address that is not a configured proxy changes nothing;
* guessing costs: bad keys from one IP hit 429, guesses at a key's prefix hit 429 while the
  real key keeps working, and wrong dashboard passwords lock the account (and the IP);
* a blocked address still has its valid credentials served: the back-off refuses only failing
  ones (one broken client behind a school's NAT must not lock out every agent there).

Throttle windows run on the pinned clock (conftest `throttle_clock`); the counters are real Redis.
"""

from __future__ import annotations

from secrets import token_hex
from typing import Any

import jwt
import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from accounts.authentication import access_token_for_key
from accounts.models import ApiKey, AuditEvent, Membership, Organization, User
from accounts.services import api_key_issue, membership_add
from memoryhub.errors import InvalidInput
from stacks.models import TeacherAssignment
from stacks.services import teacher_unassign
from tests.accounts.clients import csrf_session_client
from tests.actors import FrozenClock, School
from tests.factories import bearer_client, make_key, make_org, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_clock")]

PASSWORD = "correct horse battery staple"  # tests.factories.make_user's


def signed(claims: dict[str, Any]) -> str:
    """A token signed with the server's real JWT signing key: only its claims can be wrong."""
    return jwt.encode(claims, settings.JWT_SIGNING_KEY, algorithm="HS256")


def allow_teacher_keys(org: Organization) -> None:
    Organization.objects.filter(pk=org.pk).update(teachers_may_manage_keys=True)


# --- a token is bound to its key, school, stack and scope ---------------------------------------


def test_a_token_acts_only_as_the_key_it_was_issued_from(school: School, other_school: School) -> None:
    claims = dict(access_token_for_key(school.agent_key).payload)
    assert bearer_client(signed(claims)).get(school.stack_url()).status_code == 200  # unchanged: accepted
    read_only_key, _ = make_key(school.org, stack=school.stack, user=school.admin, read_only=True)
    forgeries = {
        # The attack: a read-only key's holder names the stack's read-write key id.
        "another key of the stack": {**dict(access_token_for_key(read_only_key).payload),
                                     "key_id": school.agent_key.public_id},
        "another school's key": {**claims, "key_id": other_school.admin_key.public_id},
        "another school": {**claims, "org_id": other_school.org.public_id},
        "another stack": {**claims, "stack_id": school.other_stack.slug},
        "another person": {**claims, "user_id": school.teacher.public_id, "sub": school.teacher.public_id},
        "a wider scope": {**dict(access_token_for_key(read_only_key).payload), "read_only": False},
        "no binding (an earlier release's token)": {k: v for k, v in claims.items()
                                                    if k not in ("org_id", "read_only")},
    }
    for name, forged in forgeries.items():
        client = bearer_client(signed(forged))
        for response in (client.get(school.stack_url()), client.get("/api/v1/stacks/"),
                         client.post(school.stack_url("memories"), {"kind": "note", "data": {"content": "x"}},
                                     format="json")):
            assert response.status_code == 401, f"{name}: {response.status_code}"
            assert response.json()["error"]["code"] == "invalid_token", name
    assert not school.stack.memories.exists()


# --- access dies with its grant -------------------------------------------------------------------


def _teacher_key(school: School) -> tuple[str, str]:
    """A key the school's teacher issues for their assigned stack through the API (policy on)."""
    allow_teacher_keys(school.org)
    response = csrf_session_client(school.teacher).post("/api/v1/keys/", {"stack_id": school.stack.slug,
                                                                          "name": "teacher's"}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"], response.json()["key"]


def test_an_unassigned_teachers_key_and_its_token_are_refused_on_their_next_use(school: School) -> None:
    key_id, secret = _teacher_key(school)
    token = APIClient().post("/auth/login", HTTP_AUTHORIZATION=f"Bearer {secret}").json()["token"]
    for credential in (secret, token):
        assert bearer_client(credential).get(school.stack_url()).status_code == 200
    removed = school.admin_api.delete(f"/api/v1/stacks/{school.stack.slug}/teachers/{school.teacher.public_id}/")
    assert removed.status_code == 204
    for credential in (secret, token):
        assert bearer_client(credential).get(school.stack_url()).status_code == 401
        assert bearer_client(credential).get(school.stack_url("memories")).status_code == 401
    revoked = ApiKey.objects.get(public_id=key_id)
    assert revoked.revoked_at is not None
    event = AuditEvent.objects.get(action="key.revoked", target_id=key_id)
    assert event.metadata["reason"] == "teacher_unassigned"
    assert bearer_client(school.agent_secret).get(school.stack_url()).status_code == 200  # the admin's stays


def test_a_key_dies_with_its_grant_even_when_the_grant_ends_outside_the_services(school: School) -> None:
    """The Django admin (or any direct write) deletes an assignment without revoking anything:
    authentication itself re-checks the key against its issuer's access on every use."""
    key_id, secret = _teacher_key(school)
    TeacherAssignment.objects.filter(user=school.teacher, stack=school.stack).delete()
    response = bearer_client(secret).get(school.stack_url())
    assert response.status_code == 401 and response.json()["error"]["code"] == "key_access_ended"
    assert ApiKey.objects.get(public_id=key_id).revoked_at is None  # refused without being revoked
    Membership.objects.filter(user=school.admin, organization=school.org).update(role=Membership.Role.BILLING)
    assert school.admin_api.get("/api/v1/stacks/").status_code == 401  # a school key of a demoted admin
    assert bearer_client(school.agent_secret).get(school.stack_url()).status_code == 401


def test_a_lowered_role_revokes_the_keys_it_no_longer_covers(school: School) -> None:
    membership_add(organization=school.org, user=school.admin, role=Membership.Role.TEACHER)
    school.admin_key.refresh_from_db()
    school.agent_key.refresh_from_db()
    # Teacher now, assigned to nothing: neither the school key nor the agent key is covered.
    assert school.admin_key.revoked_at is not None and school.agent_key.revoked_at is not None
    assert {e.metadata["reason"] for e in AuditEvent.objects.filter(action="key.revoked")} == {"role_changed"}
    assert AuditEvent.objects.filter(action="member.role_changed", target_id=school.admin.public_id).exists()


def test_teachers_issue_no_keys_unless_their_school_allows_it(school: School) -> None:
    teacher = csrf_session_client(school.teacher)
    refused = teacher.post("/api/v1/keys/", {"stack_id": school.stack.slug}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "teacher_keys_disabled"
    assert "key" not in refused.json()
    allow_teacher_keys(school.org)
    issued = teacher.post("/api/v1/keys/", {"stack_id": school.stack.slug}, format="json")
    assert issued.status_code == 201
    assert ApiKey.objects.get(public_id=issued.json()["id"]).user == school.teacher  # acts as the teacher
    # Never a school key, never a stack the teacher is not assigned to.
    assert teacher.post("/api/v1/keys/", {"name": "school"}, format="json").status_code == 403
    assert teacher.post("/api/v1/keys/", {"stack_id": school.other_stack.slug}, format="json").status_code == 404


@pytest.mark.parametrize("path", ["/api/v1/keys/{key}/cycle", "/auth/keys/{key}/cycle"])
def test_a_teacher_never_receives_the_secret_of_a_key_issued_to_someone_else(school: School, path: str) -> None:
    teacher = csrf_session_client(school.teacher)
    agent_key = school.agent_key.public_id  # the student's tutor agent's key, issued to the admin
    for allowed in (False, True):
        Organization.objects.filter(pk=school.org.pk).update(teachers_may_manage_keys=allowed)
        response = teacher.post(path.format(key=agent_key))
        assert response.status_code == 403, (allowed, response.content)
        assert "knl_sk_" not in response.content.decode()
        assert teacher.delete(f"/api/v1/keys/{agent_key}/").status_code == 403
    assert ApiKey.objects.get(public_id=agent_key).revoked_at is None
    assert bearer_client(school.agent_secret).get(school.stack_url()).status_code == 200


def test_a_teacher_allowed_to_manage_keys_cycles_their_own_and_the_new_key_keeps_their_grant(school: School) -> None:
    key_id, _ = _teacher_key(school)
    cycled = csrf_session_client(school.teacher).post(f"/api/v1/keys/{key_id}/cycle")
    assert cycled.status_code == 200
    new_secret = cycled.json()["key"]
    assert bearer_client(new_secret).get(school.stack_url()).status_code == 200
    teacher_unassign(stack=school.stack, teacher=school.teacher)
    assert bearer_client(new_secret).get(school.stack_url()).status_code == 401


def test_a_key_is_never_issued_beyond_its_owners_access(school: School) -> None:
    billing = make_user(school.org, role=Membership.Role.BILLING)
    outsider = make_user(make_org())
    for user, stack_id in [(school.teacher, None), (school.teacher, school.other_stack.pk), (billing, school.stack.pk),
                           (outsider, school.stack.pk)]:
        with pytest.raises(InvalidInput) as refused:
            api_key_issue(organization=school.org, user=user, stack_id=stack_id)
        assert refused.value.code == "owner_lacks_access"


# --- the client IP -------------------------------------------------------------------------------


def test_no_proxy_is_trusted_by_default() -> None:
    assert settings.TRUSTED_PROXIES == []


def test_rotating_forwarded_for_from_an_untrusted_address_does_not_escape_the_limits() -> None:
    """From a school-LAN address (trusted by the old default): every request counts against it."""
    lan = "10.1.2.3"
    for n in range(5):
        response = APIClient().post("/auth/register", {"stack_id": f"agent-{n}"}, format="json",
                                    HTTP_X_FORWARDED_FOR=f"198.51.100.{n}", REMOTE_ADDR=lan)
        assert response.status_code == 201
    refused = APIClient().post("/auth/register", {"stack_id": "agent-6"}, format="json",
                               HTTP_X_FORWARDED_FOR="198.51.100.77", REMOTE_ADDR=lan)
    assert refused.status_code == 429 and refused["Retry-After"]
    statuses = [APIClient().post("/auth/login", HTTP_AUTHORIZATION=f"Bearer knl_sk_{token_hex(16)}",
                                 HTTP_X_FORWARDED_FOR=f"203.0.113.{n}", REMOTE_ADDR=lan).status_code for n in range(35)]
    assert statuses[:30] == [401] * 30 and set(statuses[30:]) == {429}


# --- what guessing costs --------------------------------------------------------------------------


def test_100_bad_keys_from_one_ip_hit_429_while_good_credentials_from_there_are_served(
        school: School, throttle_clock: FrozenClock) -> None:
    """One broken client behind a school's NAT (all its agents share 127.0.0.1 here) must not lock
    out every agent at that address: its failing credentials are refused, valid ones served."""
    statuses = [bearer_client(f"knl_sk_{token_hex(16)}").get("/api/v1/stacks/").status_code for _ in range(100)]
    limit = settings.AUTH_FAILURE_LIMITS["bearer_ip"][0]
    assert statuses[:limit] == [401] * limit and set(statuses[limit:]) == {429}
    refused = bearer_client(f"knl_sk_{token_hex(16)}").get(school.stack_url())
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "throttled"
    first_block = int(refused["Retry-After"])
    assert first_block == settings.AUTH_FAILURE_LIMITS["bearer_ip"][2]
    # From the same address, while it is blocked: a valid key, and a token issued from it, are served.
    assert bearer_client(school.agent_secret).get(school.stack_url()).status_code == 200
    token = APIClient().post("/auth/login", HTTP_AUTHORIZATION=f"Bearer {school.agent_secret}").json()["token"]
    assert bearer_client(token).get(school.stack_url()).status_code == 200
    assert bearer_client(token + "x").get(school.stack_url()).status_code == 429  # a bad token is not
    # Back-off: after the block the address may fail again, and its next block lasts twice as long.
    throttle_clock.advance(first_block + 1)
    assert bearer_client(f"knl_sk_{token_hex(16)}").get(school.stack_url()).status_code == 401
    throttle_clock.advance(settings.AUTH_FAILURE_LIMITS["bearer_ip"][1])  # the next counting window
    for _ in range(limit):
        bearer_client(f"knl_sk_{token_hex(16)}").get("/api/v1/stacks/")
    again = bearer_client(f"knl_sk_{token_hex(16)}").get(school.stack_url())
    assert again.status_code == 429 and int(again["Retry-After"]) == 2 * first_block
    assert bearer_client(school.agent_secret).get(school.stack_url()).status_code == 200


def test_bad_tokens_count_against_the_ip_too() -> None:
    statuses = [bearer_client(f"not.a.jwt{n}").get("/api/v1/stacks/", REMOTE_ADDR="203.0.113.67").status_code
                for n in range(60)]
    assert 429 in statuses and statuses[0] == 401


def test_guessing_at_a_keys_prefix_hits_429_while_the_real_key_keeps_working(school: School) -> None:
    prefix = school.agent_key.key_prefix  # visible to anyone who may list the stack's keys
    limit = settings.AUTH_FAILURE_LIMITS["bearer_prefix"][0]
    statuses = [bearer_client(prefix + token_hex(16)[: 39 - len(prefix)]).get(
        "/api/v1/stacks/", REMOTE_ADDR=f"198.51.100.{n}").status_code for n in range(limit + 5)]
    assert statuses[: limit - 1] == [401] * (limit - 1) and set(statuses[limit - 1:]) == {429}
    assert bearer_client(school.agent_secret).get(school.stack_url(), REMOTE_ADDR="198.51.100.200").status_code == 200


def _sign_in(username: str, password: str, ip: str = "192.0.2.10") -> Any:
    return Client(REMOTE_ADDR=ip).post("/login/", {"username": username, "password": password})


def test_10_wrong_dashboard_passwords_lock_the_account_for_a_while(school: School,
                                                                   throttle_clock: FrozenClock) -> None:
    username = school.admin.username
    for n in range(9):
        assert _sign_in(username, f"wrong-{n}").status_code == 200  # the form again, "Wrong email or password"
    locked = _sign_in(username, "wrong-9")
    assert locked.status_code == 429 and "Too many failed sign-in attempts" in locked.content.decode()
    # Even the right password, from anywhere, is refused while the account is locked.
    refused = _sign_in(username, PASSWORD, ip="192.0.2.99")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "locked for 15 minutes" in refused.content.decode()
    assert "_auth_user_id" not in refused.wsgi_request.session
    assert AuditEvent.objects.filter(action="login.locked", target_id=school.admin.public_id).exists()
    assert _sign_in(school.teacher.username, PASSWORD).status_code == 302  # other accounts are unaffected
    throttle_clock.advance(settings.AUTH_FAILURE_LIMITS["login_account"][2] + 1)
    assert _sign_in(username, PASSWORD).status_code == 302


def test_unknown_account_names_lock_the_same_way(school: School) -> None:
    """No difference between a name that exists and one that does not (nothing to enumerate)."""
    for n in range(10):
        _sign_in("nobody@example.test", f"wrong-{n}")
    assert _sign_in("nobody@example.test", "anything").status_code == 429
    assert _sign_in("NOBODY@example.test", "anything").status_code == 429  # the name is case-folded


def test_many_wrong_passwords_from_one_ip_lock_that_ip(school: School) -> None:
    users = [make_user(school.org).username for _ in range(4)]
    limit = settings.AUTH_FAILURE_LIMITS["login_ip"][0]
    for n in range(limit):
        _sign_in(users[n % len(users)] if n % 3 else f"someone{n}@example.test", "wrong", ip="192.0.2.50")
    assert _sign_in(school.teacher.username, PASSWORD, ip="192.0.2.50").status_code == 429
    assert _sign_in(school.teacher.username, PASSWORD, ip="192.0.2.51").status_code == 302
    assert User.objects.filter(pk=school.teacher.pk).exists()
