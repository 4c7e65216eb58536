"""Issuing a key for a student's stack: the choice that makes it the student's own agent key is named,
restricted and audited, and a cycle never hands a secret to someone who may not read what it reads
(docs/privacy.md "Keys and the grants"; what each key then reads: tests/memories/test_grants_issued_keys.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from accounts.models import ApiKey, AuditEvent, Organization
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import bearer_client, make_key

pytestmark = pytest.mark.django_db


def allow_teacher_keys(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(teachers_may_manage_keys=True)


def issue(client: APIClient, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/keys/", body, format="json")


def test_the_student_s_own_agent_key_is_an_explicit_audited_choice(school: School) -> None:
    admin = csrf_session_client(school.admin)
    plain = issue(admin, {"stack_id": school.stack.slug, "name": "helper"})
    agent = issue(admin, {"stack_id": school.stack.slug, "name": "tutor", "stack_agent": True})
    assert plain.status_code == agent.status_code == 201
    assert plain.json()["stack_agent"] is False and agent.json()["stack_agent"] is True
    assert plain.json()["issued_by_key"] is None
    assert ApiKey.objects.get(public_id=plain.json()["id"]).stack_agent is False
    assert ApiKey.objects.get(public_id=agent.json()["id"]).stack_agent is True
    chosen = AuditEvent.objects.filter(action="key.issued_as_stack_agent",
                                       target_id__in=[plain.json()["id"], agent.json()["id"]])
    assert [(e.target_id, e.actor) for e in chosen] == [(agent.json()["id"], school.admin)]
    issued = AuditEvent.objects.get(action="key.issued", target_id=agent.json()["id"])
    assert issued.metadata["stack_agent"] is True
    # Listed as such.
    listed = {k["id"]: k["stack_agent"] for k in admin.get("/api/v1/keys/").json()["results"]}
    assert listed[agent.json()["id"]] is True and listed[plain.json()["id"]] is False


def test_a_key_a_school_key_issues_records_it(school: School) -> None:
    response = issue(school.admin_api, {"stack_id": school.stack.slug})
    assert response.status_code == 201
    assert response.json()["issued_by_key"] == school.admin_key.public_id
    assert ApiKey.objects.get(public_id=response.json()["id"]).issued_by_key == school.admin_key.public_id
    # A school key may make the deliberate choice too (a school's provisioning integration); audited as the key.
    agent = issue(school.admin_api, {"stack_id": school.stack.slug, "stack_agent": True})
    assert agent.status_code == 201
    assert AuditEvent.objects.get(action="key.issued_as_stack_agent", target_id=agent.json()["id"]).actor_key == (
        school.admin_key)


def test_only_school_managers_may_issue_the_stack_s_own_agent_key(school: School) -> None:
    allow_teacher_keys(school)
    before = ApiKey.objects.count()
    teacher = issue(csrf_session_client(school.teacher), {"stack_id": school.stack.slug, "stack_agent": True})
    assert teacher.status_code == 403 and teacher.json()["error"]["code"] == "stack_agent_needs_admin"
    _, read_only_secret = make_key(school.org, user=school.admin, read_only=True)
    read_only = issue(bearer_client(read_only_secret), {"stack_id": school.stack.slug, "stack_agent": True})
    assert read_only.status_code == 403
    agent = issue(school.agent, {"stack_id": school.stack.slug, "stack_agent": True})
    assert agent.status_code == 403
    no_stack = issue(csrf_session_client(school.admin), {"stack_agent": True})
    assert no_stack.status_code == 400 and no_stack.json()["error"]["code"] == "stack_agent_needs_stack"
    assert "stack_agent" in no_stack.json()["error"]["fields"]
    assert ApiKey.objects.count() == before + 1  # only the read-only school key made above
    assert AuditEvent.objects.filter(action="key.issued_as_stack_agent").count() == 1  # the cast's agent key


def test_the_schema_names_the_choice() -> None:
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    field = components["KeyIssueRequest"]["properties"]["stack_agent"]
    assert field["type"] == "boolean" and "student's own agent" in field["description"]
    assert "stack_agent" in components["KeySummary"]["properties"]
    assert "issued_by_key" in components["KeySummary"]["properties"]


# --- cycling hands out a secret: only to someone who may read what it reads ------------------------


def cycle(client: APIClient, key_id: str, path: str = "/api/v1/keys/{key}/cycle") -> Any:
    return client.post(path.format(key=key_id))


@pytest.mark.parametrize("path", ["/api/v1/keys/{key}/cycle", "/auth/keys/{key}/cycle"])
def test_an_admin_cannot_take_over_a_teachers_key_by_cycling_it(school: School, path: str) -> None:
    """The teacher's key reads `human:<teacher>` memories the admin may not: its new secret is not the admin's."""
    allow_teacher_keys(school)
    teacher = csrf_session_client(school.teacher)
    key_id = issue(teacher, {"stack_id": school.stack.slug}).json()["id"]
    refused = cycle(csrf_session_client(school.admin), key_id, path)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_key_issuer"
    assert "knl_sk_" not in refused.content.decode()
    refused = cycle(school.admin_api, key_id, path)
    assert refused.status_code == 403
    assert ApiKey.objects.get(public_id=key_id).revoked_at is None
    # The admin may still revoke it; the teacher cycles their own.
    assert cycle(teacher, key_id).status_code == 200


def test_a_key_a_school_key_issued_is_cycled_by_that_key_and_keeps_what_it_reads(school: School) -> None:
    key_id = issue(school.admin_api, {"stack_id": school.stack.slug}).json()["id"]
    assert cycle(csrf_session_client(school.admin), key_id).status_code == 403
    cycled = cycle(school.admin_api, key_id)
    assert cycled.status_code == 200
    new = ApiKey.objects.get(public_id=cycled.json()["id"])
    assert (new.issued_by_key, new.stack_agent) == (school.admin_key.public_id, False)


def test_the_stack_s_own_agent_key_stays_one_when_cycled_and_only_managers_or_itself_cycle_it(school: School) -> None:
    agent = school.agent_key
    assert agent.stack_agent is True
    allow_teacher_keys(school)
    assert cycle(csrf_session_client(school.teacher), agent.public_id).status_code == 403
    by_itself = cycle(school.agent, agent.public_id, "/auth/keys/{key}/cycle")  # as the kernle CLI does
    assert by_itself.status_code == 200 and by_itself.json()["stack_agent"] is True
    by_admin = cycle(csrf_session_client(school.admin), by_itself.json()["id"])
    assert by_admin.status_code == 200
    assert ApiKey.objects.get(public_id=by_admin.json()["id"]).stack_agent is True
    assert AuditEvent.objects.filter(action="key.issued_as_stack_agent").count() == 3  # the cast's, two cycles


# --- the keys issued before: the migration's choice ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_only_personal_accounts_keys_as_the_stack_s_own() -> None:
    """Keys issued before `stack_agent` existed: a personal account's stack key (kernle register) stays
    the stack's own; a school's stack keys read as their issuer — the school key that issued one (from
    the audit log), carried over a cycle — or the person."""
    before, after = [("accounts", "0007_organization_overflow_tier")], [("accounts", "0008_key_audience")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    # What the database holds now: accounts just before the migration, every other app as far as
    # that allows (a later migration of another app that needs a newer accounts was unapplied).
    executor.loader.build_graph()
    applied = [node for node in executor.loader.applied_migrations if node in executor.loader.graph.nodes]
    apps = executor.loader.project_state(applied).apps
    Org, User, Stack = (apps.get_model(label) for label in ("accounts.Organization", "accounts.User", "stacks.Stack"))
    Key, Event = apps.get_model("accounts", "ApiKey"), apps.get_model("accounts", "AuditEvent")
    try:
        person = User.objects.create(username="old-admin", public_id="usr_oldadmin0001")
        school = Org.objects.create(name="Old school", slug="old-school", kind="school", public_id="org_old000000001")
        personal = Org.objects.create(name="Ada", slug="personal-ada", kind="personal", public_id="org_old000000002")
        school_stack = Stack.objects.create(organization=school, slug="ada")
        own_stack = Stack.objects.create(organization=personal, slug="ada-agent")

        def key(org: Any, public_id: str, stack: Any = None, **fields: Any) -> Any:
            return Key.objects.create(organization=org, user=person, stack=stack, public_id=public_id,
                                      key_prefix=public_id[:12], key_hash="x", **fields)

        school_key = key(school, "key_school")
        by_admin = key(school, "key_by_admin", school_stack)
        by_school_key = key(school, "key_by_school", school_stack)
        Event.objects.create(organization=school, action="key.issued", target_type="api_key",
                             target_id="key_by_school", actor_key=school_key)
        cycled = key(school, "key_cycled", school_stack)
        Key.objects.filter(pk=by_school_key.pk).update(replaced_by=cycled)
        # The cycle's own `key.issued` names whoever cycled it (here the admin's own stack key).
        Event.objects.create(organization=school, action="key.issued", target_type="api_key",
                             target_id="key_cycled", actor_key=by_admin)
        key(personal, "key_register", own_stack)
        key(personal, "key_account")

        executor = MigrationExecutor(connection)
        executor.migrate(after)
        values = dict(ApiKey.objects.values_list("public_id", "stack_agent"))
        issuers = dict(ApiKey.objects.values_list("public_id", "issued_by_key"))
        assert values == {"key_school": False, "key_by_admin": False, "key_by_school": False, "key_cycled": False,
                          "key_register": True, "key_account": False}
        assert issuers == {"key_school": "", "key_by_admin": "", "key_by_school": "key_school",
                           "key_cycled": "key_school", "key_register": "", "key_account": ""}
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
