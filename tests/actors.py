"""The typed cast most API tests need — a school, its people, two student stacks and their keys —
and a clock that moves only when a test says so.

`tests/conftest.py` serves it as the `school` and `other_school` fixtures. Everything is made
through the factories, which write through the services; a test that needs one more actor (a
read-only key, a teacher of the other stack) builds it with the factories beside the cast.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from rest_framework.test import APIClient

from accounts.models import ApiKey, Membership, Organization, User
from stacks.models import Stack
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user


@dataclass(frozen=True)
class School:
    """One school. Its `teacher` is assigned to `stack` only, so `other_stack` is a sibling that
    teacher (and `agent_key`) must not reach. The bearer clients are built on first use."""

    org: Organization
    admin: User
    teacher: User
    stack: Stack  # "alice"
    other_stack: Stack  # "bob", same school
    admin_key: ApiKey  # school-wide (no stack binding), owned by `admin`
    admin_secret: str
    agent_key: ApiKey  # bound to `stack`: what a student's tutor agent holds
    agent_secret: str

    @cached_property
    def agent(self) -> APIClient:
        """Bearer client of the agent key bound to `stack`."""
        return bearer_client(self.agent_secret)

    @cached_property
    def admin_api(self) -> APIClient:
        """Bearer client of the school-wide key."""
        return bearer_client(self.admin_secret)

    def stack_url(self, tail: str = "") -> str:
        """`/api/v1/stacks/<slug of stack>/<tail>`."""
        return f"/api/v1/stacks/{self.stack.slug}/{tail}"


def school_cast(name: str | None = None, *, stack_slug: str = "alice", other_stack_slug: str = "bob") -> School:
    org = make_org(name)
    admin = make_user(org, role=Membership.Role.ADMIN)
    teacher = make_user(org, role=Membership.Role.TEACHER)
    stack = make_stack(org, stack_slug)
    other_stack = make_stack(org, other_stack_slug)
    assign_teacher(teacher, stack)
    admin_key, admin_secret = make_key(org, user=admin, name="school key")
    agent_key, agent_secret = make_key(org, stack=stack, user=admin, name="agent key")
    return School(org=org, admin=admin, teacher=teacher, stack=stack, other_stack=other_stack,
                  admin_key=admin_key, admin_secret=admin_secret, agent_key=agent_key, agent_secret=agent_secret)


@dataclass
class FrozenClock:
    """A stand-in for `time.time` that moves only when told to (`advance`); conftest's
    `throttle_clock` installs one as the rate limiter's clock."""

    now: float

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
