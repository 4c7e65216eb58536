"""The stack lookup every request makes: one written-out statement, for a key and for staff alike,
and it must give what the visibility queryset gives (docs/architecture.md §7.2)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
from accounts.principal import Principal
from accounts.selectors import principal_for_session
from stacks.models import GuardianLink, Stack, TeacherAssignment
from stacks.selectors import stacks_visible_to, visible_stack
from tests.factories import assign_teacher, make_key, make_org, make_stack, make_user, other_connection

pytestmark = pytest.mark.django_db(transaction=True)


def key_principal(org, stack: Stack | None = None, *, read_only: bool = False) -> Principal:
    key, _ = make_key(org, stack=stack, read_only=read_only)
    return Principal(user=key.user, organization=org, api_key=key, read_only=read_only,
                     bound_stack_id=stack.pk if stack is not None else None)


def pk_of(stack: Stack | None) -> int | None:
    return None if stack is None else stack.pk


def as_queryset_sees(principal: Principal, slug: str) -> Stack | None:
    return stacks_visible_to(principal).filter(slug=slug).first()


def test_a_keys_lookup_gives_the_visibility_querysets_answer_for_every_kind_of_key() -> None:
    org, other = make_org(), make_org()
    mine = make_stack(org, "s1", display_name="Ada", bytes_used=4096)
    sibling = make_stack(org, "s2", status=Stack.Status.ARCHIVED)
    foreign = make_stack(other, "s1")  # the same slug in another school
    principals = [key_principal(org, mine), key_principal(org, mine, read_only=True), key_principal(org),
                  key_principal(org, sibling), key_principal(other, foreign), key_principal(other)]
    checked = 0
    for principal in principals:
        for slug in ("s1", "s2", "s3"):
            expected = as_queryset_sees(principal, slug)
            found = visible_stack(principal, slug)
            if expected is None:
                assert found is None, (principal, slug)
                continue
            assert found is not None and found.pk == expected.pk
            assert model_to_dict(found) == model_to_dict(expected)  # every column, not just the id
            assert found.organization is principal.organization  # the caller's, with no query
            checked += 1
    assert checked == 7  # each bound key its one stack (4), the school keys their schools' stacks (2 + 1)
    # A bound key never reaches its school's other stacks, nor a stack of the same slug elsewhere.
    assert visible_stack(principals[0], "s2") is None
    assert pk_of(visible_stack(principals[4], "s1")) == foreign.pk


def test_a_staff_lookup_gives_the_visibility_querysets_answer_for_every_role() -> None:
    org, other = make_org(), make_org()
    taught, untaught = make_stack(org, "s1", display_name="Ada"), make_stack(org, "s2")
    foreign = make_stack(other, "s1")  # the same slug in another school
    admin, teacher, guardian = (make_user(org, role=role) for role in (
        Membership.Role.ADMIN, Membership.Role.TEACHER, Membership.Role.GUARDIAN))
    billing, foreign_admin = make_user(org, role=Membership.Role.BILLING), make_user(other)
    assign_teacher(teacher, taught)
    GuardianLink.objects.create(user=guardian, stack=untaught)
    principals = [principal_for_session(user) for user in (admin, teacher, guardian, billing, foreign_admin)]
    reached = []
    for principal in principals:
        assert principal is not None
        for slug in ("s1", "s2", "s3"):
            expected = as_queryset_sees(principal, slug)
            with CaptureQueriesContext(connection) as queries:
                found = visible_stack(principal, slug)
            assert len(queries) <= 1
            if expected is None:
                assert found is None, (principal.role, slug)
                continue
            assert found is not None and model_to_dict(found) == model_to_dict(expected)
            assert found.organization is principal.organization
            reached.append((principal.user.pk, found.pk))
    # The admin both of their school's stacks, the teacher their assigned one, the guardian their
    # child's, billing none, the other school's admin only their own.
    assert reached == [(admin.pk, taught.pk), (admin.pk, untaught.pk), (teacher.pk, taught.pk),
                       (guardian.pk, untaught.pk), (foreign_admin.pk, foreign.pk)]


def test_a_keys_lookup_is_one_statement_and_locks_only_when_asked() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    principal = key_principal(org, stack)
    with CaptureQueriesContext(connection) as plain:
        assert pk_of(visible_stack(principal, "s1")) == stack.pk
    assert len(plain.captured_queries) == 1
    assert "FOR UPDATE" not in plain.captured_queries[0]["sql"]
    with transaction.atomic(), CaptureQueriesContext(connection) as locking:
        assert pk_of(visible_stack(principal, "s1", lock=True)) == stack.pk
        with connection.cursor() as cursor:  # the row is held by this transaction
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND pid = pg_backend_pid()")
            assert cursor.fetchone()[0] == 1
    assert "FOR UPDATE" in locking.captured_queries[0]["sql"]


@pytest.mark.parametrize("slug", ["", "x" * 101, "s1\x00", 7, None])
def test_a_slug_that_names_nothing_is_not_looked_up(slug: object) -> None:
    org = make_org()
    principal = key_principal(org, make_stack(org, "s1"))
    with CaptureQueriesContext(connection) as queries:
        assert visible_stack(principal, slug) is None
    assert queries.captured_queries == []


def test_a_teachers_locked_lookup_holds_the_stack_row_and_leaves_their_assignment_free() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    teacher = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(teacher, stack)
    principal = principal_for_session(teacher)
    assert principal is not None
    with transaction.atomic():
        assert pk_of(visible_stack(principal, "s1", lock=True)) == stack.pk
        # Another session, as a concurrent writer would be: the stack row is taken, the
        # assignment (read in the lookup's subquery) is not.
        with other_connection(autocommit=True) as other:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(f"SELECT 1 FROM {Stack._meta.db_table} WHERE id = %s FOR UPDATE NOWAIT",  # noqa: S608
                              [stack.pk])
            assignment = TeacherAssignment._meta.db_table
            free = other.execute(f"SELECT stack_id FROM {assignment} WHERE stack_id = %s FOR UPDATE NOWAIT",  # noqa: S608
                                 [stack.pk])
            assert free.fetchall() == [(stack.pk,)]
