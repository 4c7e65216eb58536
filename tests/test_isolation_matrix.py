"""The isolation matrix: nobody reaches a stack that is not theirs, through any endpoint.

Actors (all real credentials through the real authentication):

* ``school_a_key`` — a school-wide key of school A (may reach A's stacks; targets: B's stack);
* ``a1_key`` — an agent key bound to stack A1 (targets: A2, B1);
* ``teacher_a`` — a dashboard session (with CSRF) of a teacher of A assigned only to A1 (targets: A2, B1);
* ``school_b_key`` — a school-wide key of school B (targets: A1, A2);
* ``a1_read_only_key`` — a read-only key bound to A1, writing to A1 (refused with 403);
* ``a1_teacher_key`` — a key ``teacher_a`` issued for A1 (school A lets teachers manage keys; the
  key acts as the teacher) (targets: A2, B1); ``a1_teacher_read_only_key``, its read-only twin;
* ``a2_stale_teacher_key`` — a key another teacher issued for A2 before that assignment was deleted
  behind the services' back (as the Django admin would): refused with 401 everywhere, A2 included;
* ``guardian_a1`` — a dashboard session (with CSRF) of a parent linked to A1 only (targets: A2, another
  family's child, and B1; tests/test_isolation_guardians.py covers every route and the dashboard).

Every attempt must be refused — 404 for a stack the actor cannot see (never a hint that it exists),
403 for a read-only key writing — and must store nothing: the target stack's row and every row
of every model that points at it (memories, checkpoints, keys, assignments, … — found through
the Stack model's relations, so new models are covered automatically) and the target school's
audit log are compared before and after.

HOW TO ADD AN ENDPOINT: append an ``EndpointSpec`` to ``STACK_ENDPOINTS`` (or a ``ListSpec`` to
``LIST_ENDPOINTS`` for collection reads). Paths and bodies may use the placeholders ``{stack}``
(the target stack id), ``{key}`` (public id of a key bound to the target stack) and ``{teacher}``
(public id of a teacher assigned to the target stack); ``prepare`` can create data in the target
stack first (e.g. a memory) and return extra placeholders (e.g. ``{"memory": "<id>"}``). Set
``refused`` when an endpoint documents a different refusal (e.g. kernle's push answers 200 with
per-operation conflicts: use ``refused=200`` and let the snapshot prove nothing was stored).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiKey, AuditEvent, Membership, Organization
from accounts.throttles import throttle_state_clear
from stacks.models import GuardianLink, Stack, TeacherAssignment
from tests.accounts.clients import csrf_session_client
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    method: str  # get, post, patch, put, delete
    path: str
    body: Any = None
    write: bool = False
    refused: int = 404
    prepare: Callable[[Stack], dict[str, str]] | None = None


@dataclass(frozen=True)
class ListSpec:
    """A collection read: must answer 200 and never mention the target stack or its keys."""

    name: str
    path: str
    ok_statuses: tuple[int, ...] = (200,)


STACK_ENDPOINTS: list[EndpointSpec] = [
    EndpointSpec("stack detail", "get", "/api/v1/stacks/{stack}/"),
    EndpointSpec("stack update", "patch", "/api/v1/stacks/{stack}/", {"display_name": "pwned"}, write=True),
    EndpointSpec("stack archive", "post", "/api/v1/stacks/{stack}/archive", write=True),
    EndpointSpec("stack unarchive", "post", "/api/v1/stacks/{stack}/unarchive", write=True),
    EndpointSpec("stack teachers", "get", "/api/v1/stacks/{stack}/teachers/"),
    EndpointSpec("stack teacher assign", "post", "/api/v1/stacks/{stack}/teachers/", {"user_id": "{teacher}"},
                 write=True),
    EndpointSpec("stack teacher unassign", "delete", "/api/v1/stacks/{stack}/teachers/{teacher}/", write=True),
    EndpointSpec("key issue for stack", "post", "/api/v1/keys/", {"stack_id": "{stack}", "name": "intruder"},
                 write=True),
    EndpointSpec("key detail", "get", "/api/v1/keys/{key}/"),
    EndpointSpec("key revoke", "delete", "/api/v1/keys/{key}/", write=True),
    EndpointSpec("key cycle", "post", "/api/v1/keys/{key}/cycle", write=True),
    EndpointSpec("kernle key revoke", "delete", "/auth/keys/{key}", write=True),
    EndpointSpec("kernle key cycle", "post", "/auth/keys/{key}/cycle", write=True),
    EndpointSpec("stack guardians", "get", "/api/v1/stacks/{stack}/guardians"),
    EndpointSpec("stack guardian invite", "post", "/api/v1/stacks/{stack}/guardians", {"email": "g@example.test"},
                 write=True),
    EndpointSpec("stack guardian unlink", "delete", "/api/v1/stacks/{stack}/guardians/{teacher}", write=True),
]

LIST_ENDPOINTS: list[ListSpec] = [
    ListSpec("stack list", "/api/v1/stacks/"),
    ListSpec("archived stack list", "/api/v1/stacks/?status=archived"),
    ListSpec("key list", "/api/v1/keys/"),
    ListSpec("kernle key list", "/auth/keys"),
    # Members and audit are refused (403) to agent keys and teachers; never a foreign school's.
    ListSpec("member list", "/api/v1/members/", ok_statuses=(200, 403)),
    ListSpec("audit log", "/api/v1/audit/", ok_statuses=(200, 403)),
]


@dataclass
class World:
    stacks: dict[str, Stack]
    target_keys: dict[str, ApiKey]
    target_teachers: dict[str, str]
    actors: dict[str, APIClient]
    # (actor, target stack name) pairs that must be refused
    pairs: list[tuple[str, str]] = field(default_factory=list)


def build_world() -> World:
    school_a, school_b = make_org("School A"), make_org("School B")
    stacks = {"A1": make_stack(school_a, "alpha-one"), "A2": make_stack(school_a, "alpha-two"),
              "B1": make_stack(school_b, "bravo-one")}
    target_keys, target_teachers = {}, {}
    for name, stack in stacks.items():
        target_keys[name], _ = make_key(stack.organization, stack=stack, name=f"target-{name}")
        teacher = make_user(stack.organization, role=Membership.Role.TEACHER)
        assign_teacher(teacher, stack)
        target_teachers[name] = teacher.public_id
    teacher_a = make_user(school_a, role=Membership.Role.TEACHER)
    assign_teacher(teacher_a, stacks["A1"])
    # School A lets teachers manage keys: the permissive case, so the matrix covers teacher-issued keys.
    Organization.objects.filter(pk=school_a.pk).update(teachers_may_manage_keys=True)
    stale_teacher = make_user(school_a, role=Membership.Role.TEACHER)
    assign_teacher(stale_teacher, stacks["A2"])
    _, stale_secret = make_key(school_a, stack=stacks["A2"], user=stale_teacher)
    TeacherAssignment.objects.filter(user=stale_teacher).delete()  # not through teacher_unassign: no revocation
    guardian_a1 = make_user(school_a, role=Membership.Role.GUARDIAN)
    GuardianLink.objects.create(user=guardian_a1, stack=stacks["A1"])
    actors = {
        "school_a_key": bearer_client(make_key(school_a)[1]),
        "a1_key": bearer_client(make_key(school_a, stack=stacks["A1"])[1]),
        "teacher_a": csrf_session_client(teacher_a),
        "school_b_key": bearer_client(make_key(school_b)[1]),
        "a1_read_only_key": bearer_client(make_key(school_a, stack=stacks["A1"], read_only=True)[1]),
        "a1_teacher_key": bearer_client(make_key(school_a, stack=stacks["A1"], user=teacher_a)[1]),
        "a1_teacher_read_only_key": bearer_client(make_key(school_a, stack=stacks["A1"], user=teacher_a,
                                                           read_only=True)[1]),
        "a2_stale_teacher_key": bearer_client(stale_secret),
        "guardian_a1": csrf_session_client(guardian_a1),
    }
    pairs = [("school_a_key", "B1"), ("a1_key", "A2"), ("a1_key", "B1"), ("teacher_a", "A2"),
             ("teacher_a", "B1"), ("school_b_key", "A1"), ("school_b_key", "A2"), ("a1_teacher_key", "A2"),
             ("a1_teacher_key", "B1"), ("a2_stale_teacher_key", "A2"), ("a2_stale_teacher_key", "B1"),
             ("guardian_a1", "A2"), ("guardian_a1", "B1")]
    return World(stacks, target_keys, target_teachers, actors, pairs)


IGNORED_COLUMNS = {"last_used_at"}
# Actors refused before any endpoint decides: a key whose issuer lost the grant is a 401 everywhere.
REFUSED_AS = {"a2_stale_teacher_key": 401}
READ_ONLY_ACTORS = ["a1_read_only_key", "a1_teacher_read_only_key"]


def stored_state(stack: Stack) -> str:
    """Everything stored about a stack: its row, every row of every model pointing at it, and the
    size of its school's audit log (a refused attempt must not even be audited as an action)."""
    parts = [repr(list(Stack.objects.filter(pk=stack.pk).values()))]
    for relation in Stack._meta.related_objects:
        model = relation.related_model
        assert not isinstance(model, str)
        # last_used_at is authentication bookkeeping of the acting key itself, not stored data.
        columns = [f.attname for f in model._meta.concrete_fields if f.name not in IGNORED_COLUMNS]
        rows = model._default_manager.filter(**{relation.field.name: stack.pk}).order_by("pk").values(*columns)
        parts.append(f"{model.__name__}:{list(rows)!r}")
    parts.append(f"audit:{AuditEvent.objects.filter(organization_id=stack.organization_id).count()}")
    parts.append(f"org keys:{ApiKey.objects.filter(organization_id=stack.organization_id).count()}")
    parts.append(f"orgs:{Organization.objects.count()} stacks:{Stack.objects.count()}")
    return "\n".join(parts)


def _fill(value: Any, placeholders: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**placeholders)
    if isinstance(value, dict):
        return {k: _fill(v, placeholders) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, placeholders) for v in value]
    return value


def _call(client: APIClient, spec: EndpointSpec, placeholders: dict[str, str]):
    throttle_state_clear()  # the matrix makes many calls from one IP; limits are tested elsewhere
    path = _fill(spec.path, placeholders)
    method = getattr(client, spec.method)
    if spec.body is None:
        return method(path)
    return method(path, _fill(spec.body, placeholders), format="json")


def _placeholders(world: World, target: str, spec: EndpointSpec) -> dict[str, str]:
    stack = world.stacks[target]
    values = {"stack": stack.slug, "key": world.target_keys[target].public_id,
              "teacher": world.target_teachers[target]}
    if spec.prepare is not None:
        values.update(spec.prepare(stack))
    return values


def _assert_refused(response, expected: int, context: str) -> None:
    assert response.status_code == expected, f"{context}: {response.status_code} {response.content[:300]!r}"
    if expected >= 400:
        body = response.json()
        assert body["error"]["code"] and body["detail"], context


@pytest.fixture
def world() -> World:
    return build_world()


@pytest.mark.parametrize("spec", STACK_ENDPOINTS, ids=[s.name for s in STACK_ENDPOINTS])
def test_no_actor_reaches_a_stack_that_is_not_theirs(world: World, spec: EndpointSpec) -> None:
    for actor, target in world.pairs:
        placeholders = _placeholders(world, target, spec)
        stack = world.stacks[target]
        before = stored_state(stack)
        response = _call(world.actors[actor], spec, placeholders)
        context = f"{spec.name}: {actor} -> {target}"
        expected = REFUSED_AS.get(actor, spec.refused)
        _assert_refused(response, expected, context)
        if expected in (401, 404):
            assert stack.slug.encode() not in response.content, f"{context}: leaks the stack id"
        assert stored_state(stack) == before, f"{context}: something was stored"


WRITE_ENDPOINTS = [s for s in STACK_ENDPOINTS if s.write]


@pytest.mark.parametrize("spec", WRITE_ENDPOINTS, ids=[s.name for s in WRITE_ENDPOINTS])
def test_a_read_only_key_cannot_write_its_own_stack(world: World, spec: EndpointSpec) -> None:
    for actor in READ_ONLY_ACTORS:
        placeholders = _placeholders(world, "A1", spec)
        stack = world.stacks["A1"]
        before = stored_state(stack)
        response = _call(world.actors[actor], spec, placeholders)
        _assert_refused(response, 403 if spec.refused == 404 else spec.refused, f"{spec.name}: {actor} -> A1")
        assert stored_state(stack) == before


@pytest.mark.parametrize("spec", LIST_ENDPOINTS, ids=[s.name for s in LIST_ENDPOINTS])
def test_collections_never_mention_a_foreign_stack_or_its_keys(world: World, spec: ListSpec) -> None:
    Stack.objects.filter(pk__in=[s.pk for s in world.stacks.values()]).update(status="archived")
    for actor, target in world.pairs:
        throttle_state_clear()
        response = world.actors[actor].get(spec.path)
        context = f"{spec.name}: {actor} -> {target}"
        expected = (REFUSED_AS[actor],) if actor in REFUSED_AS else spec.ok_statuses
        assert response.status_code in expected, f"{context}: {response.status_code}"
        content = response.content.decode()
        assert world.stacks[target].slug not in content, context
        assert world.target_keys[target].public_id not in content, context
        assert world.target_teachers[target] not in content, context


def test_the_matrix_world_is_reachable_by_its_rightful_owners(world: World) -> None:
    """Guards the matrix against passing vacuously: the same calls succeed for the owners."""
    assert world.actors["school_a_key"].get("/api/v1/stacks/alpha-two/").status_code == 200
    assert world.actors["a1_key"].get("/api/v1/stacks/alpha-one/").status_code == 200
    assert world.actors["teacher_a"].get("/api/v1/stacks/alpha-one/").status_code == 200
    assert world.actors["school_b_key"].get("/api/v1/stacks/bravo-one/").status_code == 200
    assert world.actors["a1_read_only_key"].get("/api/v1/stacks/alpha-one/").status_code == 200
    assert world.actors["a1_teacher_key"].get("/api/v1/stacks/alpha-one/").status_code == 200
    assert world.actors["a1_teacher_read_only_key"].get("/api/v1/stacks/alpha-one/").status_code == 200
    assert world.actors["guardian_a1"].get("/api/v1/stacks/alpha-one/").status_code == 200
    target_key = world.target_keys["A2"].public_id
    assert world.actors["school_a_key"].get(f"/api/v1/keys/{target_key}/").status_code == 200
