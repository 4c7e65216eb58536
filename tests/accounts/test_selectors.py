"""Who a signed-in user acts as: the membership lookup every dashboard page, session API call and
live page message makes is one written-out statement, and it must give what the queryset gives
(docs/architecture.md §7.2)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership, User
from accounts.selectors import membership_for_user
from tests.factories import make_org, make_user

pytestmark = pytest.mark.django_db


def as_queryset_sees(user_id: int) -> Membership | None:
    return Membership.objects.select_related("organization").filter(user_id=user_id).order_by("created_at").first()


def test_the_lookup_gives_the_querysets_answer_oldest_membership_first() -> None:
    first, second = make_org(), make_org()
    teacher = make_user(second, role=Membership.Role.TEACHER)
    Membership.objects.create(user=teacher, organization=first, role=Membership.Role.ADMIN)
    # The membership made second is dated first: the oldest by date, not by id, is the one used.
    Membership.objects.filter(user=teacher, organization=first).update(
        created_at=Membership.objects.get(user=teacher, organization=second).created_at - dt.timedelta(days=1))
    alone = make_user(first, role=Membership.Role.GUARDIAN)
    nobody = make_user()
    found: dict[User, Membership] = {}
    for user in (teacher, alone):
        expected, membership = as_queryset_sees(user.pk), membership_for_user(user.pk)
        assert expected is not None and membership is not None
        assert model_to_dict(membership) == model_to_dict(expected)  # every column, not just the id
        assert model_to_dict(membership.organization) == model_to_dict(expected.organization)
        found[user] = membership
    assert found[teacher].organization.pk == first.pk
    assert found[alone].role == Membership.Role.GUARDIAN
    assert membership_for_user(nobody.pk) is None and as_queryset_sees(nobody.pk) is None


def test_the_lookup_is_one_statement_with_the_school_loaded() -> None:
    user = make_user(make_org())
    with CaptureQueriesContext(connection) as queries:
        membership = membership_for_user(user.pk)
        assert membership is not None
        assert membership.organization.name  # no second query for the school
    assert len(queries) == 1
