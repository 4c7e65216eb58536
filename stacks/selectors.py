"""The one place that decides who may touch which stack (docs/architecture.md §7.2).

Every API view, dashboard view and websocket resolves stacks through these functions. A stack
the caller may not see is a 404 — never its data, never a hint that it exists. A read-only key
trying to write is a 403 (it can already see the stack); writing to an archived stack is a 409.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeGuard

from django.db import connection
from django.db.models import QuerySet

from accounts.models import Membership, Organization
from accounts.principal import Principal
from accounts.selectors import (
    ensure_may_issue_stack_agent_key,
    ensure_may_manage_organization,
    ensure_teacher_may_manage_keys,
)
from accounts.tiers import tier_for
from memoryhub.database import ModelRows
from memoryhub.errors import Conflict, Forbidden, NotFound, QuotaExceeded
from stacks.models import GuardianLink, Stack, TeacherAssignment


def stacks_visible_to(principal: Principal) -> QuerySet[Stack]:
    """Every stack the caller may read."""
    stacks = Stack.objects.filter(organization_id=principal.organization.pk)
    if principal.api_key is not None:
        if principal.bound_stack_id is not None:
            return stacks.filter(pk=principal.bound_stack_id)
        return stacks
    if principal.role == Membership.Role.ADMIN:
        return stacks
    if principal.role == Membership.Role.TEACHER:
        return stacks.filter(teacher_assignments__user_id=principal.user.pk)
    if principal.role == Membership.Role.GUARDIAN:
        return stacks.filter(guardian_links__user_id=principal.user.pk)  # their own children only
    return stacks.none()  # billing users see no memory at all


def stack_for_principal(principal: Principal, slug: str, *, write: bool = False, lock: bool = False) -> Stack:
    """The stack `slug` of the caller's organization, if the caller may reach it.

    `write=True` also refuses read-only credentials (403) and archived stacks (409).
    `lock=True` takes a row lock on the stack (caller must be inside a transaction); used to
    serialise pushes per stack.
    """
    stack = visible_stack(principal, slug, lock=lock)
    if stack is None:
        raise NotFound("Stack not found.", code="stack_not_found")
    if write:
        ensure_writable(principal, stack)
    return stack


def visible_stack(principal: Principal, slug: object, *, lock: bool = False) -> Stack | None:
    """The stack `slug` of the caller's organization if the caller may see it, else None (the
    lookup `stack_for_principal` refuses on; a kernle pull answers a stack that does not exist yet
    with an empty change set instead)."""
    if not plausible_identifier(slug, max_length=100):
        # PostgreSQL cannot even compare a NUL byte; such an id names nothing.
        return None
    stack = _stack_lookup(principal, slug, lock=lock)
    if stack is not None:
        # The stack's school is the caller's (the visibility filter says so), already loaded with
        # the caller: no join for it.
        stack.organization = principal.organization
    return stack


_STACK_ROWS = ModelRows(Stack)
# A teacher reaches the stacks assigned to them, a guardian their own children's (stacks_visible_to).
_LINKED_SQL: dict[str, str] = {
    str(role): (f"EXISTS (SELECT 1 FROM {connection.ops.quote_name(links._meta.db_table)} link"  # noqa: S608
                f" WHERE link.stack_id = {_STACK_ROWS.table}.id AND link.user_id = %s)")
    for role, links in ((Membership.Role.TEACHER, TeacherAssignment), (Membership.Role.GUARDIAN, GuardianLink))}


def _reach(principal: Principal) -> tuple[str, list[int]] | None:
    """stacks_visible_to's rule for this caller beyond "the caller's school", as SQL over the
    stack's table and its parameters; None: no stack at all."""
    if principal.api_key is not None:
        if principal.bound_stack_id is None:
            return "TRUE", []
        return f"{_STACK_ROWS.table}.id = %s", [principal.bound_stack_id]
    if principal.role == Membership.Role.ADMIN:
        return "TRUE", []
    linked = _LINKED_SQL.get(str(principal.role))
    if linked is not None:
        return linked, [principal.user.pk]
    return None  # billing users see no memory at all


@lru_cache(maxsize=16)
def _stack_sql(reach: str, lock: bool) -> str:
    """The lookup of one stack by school and slug within `reach` (a `_reach` rule). (organization,
    slug) is unique: no ORDER BY to find the one row. FOR UPDATE locks the stack row only: a
    teacher's assignment or a guardian's link is read in a subquery, and stays free."""
    # Only the models' own table and column names are interpolated; every value is a parameter.
    return (f"SELECT {_STACK_ROWS.columns} FROM {_STACK_ROWS.table}"  # noqa: S608
            f" WHERE organization_id = %s AND slug = %s AND {reach} LIMIT 1" + (" FOR UPDATE" if lock else ""))


def _stack_lookup(principal: Principal, slug: str, *, lock: bool) -> Stack | None:
    # Every request's first statement (an agent's, a dashboard page's, a live page message's) is
    # this lookup. It is stacks_visible_to's rule written out, so that the request does not build
    # and compile a queryset for it (docs/architecture.md §7.2); tests/stacks/test_selectors.py
    # holds it to the queryset's answer for every kind of caller.
    reach = _reach(principal)
    if reach is None:
        return None
    reach_sql, reach_params = reach
    with connection.cursor() as cursor:
        cursor.execute(_stack_sql(reach_sql, lock), [principal.organization.pk, slug, *reach_params])
        row = cursor.fetchone()
    return None if row is None else _STACK_ROWS.instance(row)


def plausible_identifier(value: object, *, max_length: int) -> TypeGuard[str]:
    """Could `value` name a row at all? (A string of sane length without NUL bytes.)"""
    return isinstance(value, str) and 0 < len(value) <= max_length and "\x00" not in value


def ensure_writable(principal: Principal, stack: Stack) -> None:
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    if principal.role == Membership.Role.GUARDIAN and principal.api_key is None:
        # A family reads, asks and consents (docs/guardians.md); it never writes memories itself.
        raise Forbidden("Guardians cannot write to a student's memory.", code="guardian_read_only")
    if stack.is_archived:
        raise Conflict("The stack is archived; it keeps its data but refuses writes.", code="stack_archived")


def stack_for_new_key(principal: Principal, slug: str | None, *, stack_agent: bool = False) -> Stack | None:
    """The stack a key the caller issues is bound to (None: a school key), if the caller may issue it.

    Visibility decides first: a stack the caller cannot see is a 404, not a 403 (and an archived
    one a 409). A school key needs a school manager; read-only and agent keys issue no keys, nor
    do teachers unless their school allows it (403). The key acts as its issuer and dies with the
    issuer's access to the stack (accounts.selectors.with_issuer_reach). `stack_agent` (the
    stack's own agent key, which reads what no member of staff may: docs/privacy.md "Keys and the
    grants") needs a school manager (403), never a teacher (and a stack: accounts.services.api_key_issue).
    """
    stack = None
    if slug:
        stack = stack_for_principal(principal, slug, write=True)
    else:
        ensure_may_manage_organization(principal)
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    if principal.is_stack_bound:
        raise Forbidden("An agent key cannot issue keys.", code="admin_required")
    ensure_teacher_may_manage_keys(principal)
    if stack_agent:
        ensure_may_issue_stack_agent_key(principal)
    return stack


# --- the stack quota -------------------------------------------------------------------------


def stack_limit_message(organization: Organization) -> str:
    tier = tier_for(organization)
    plural = "stack" if tier.syncing_stacks == 1 else "stacks"
    return f"stack limit reached ({tier.name}: {tier.syncing_stacks} syncing {plural}) — upgrade or archive a stack"


def ensure_may_activate_stack(*, organization: Organization) -> None:
    """Raise QuotaExceeded (402, `stack_limit_reached`) if the organization already has as many
    active stacks as its tier allows, so it may not create or unarchive another.

    The rule lives here, beside the table it counts, so that `stack_create` and `stack_unarchive`
    enforce it for every path (API, dashboard, commands, kernle's first push); the tier's limit
    comes from accounts.tiers. A paid tier with overflow prices in good standing is not refused:
    the extra stacks are billed with the next renewal (docs/kernle-protocol.md §12.6-12.7;
    billing.selectors.overflow_charge). A caller that goes on to activate a stack holds the
    organization's row lock first (stacks.services), or two requests could both see room for one more.
    """
    if stack_room(organization=organization) == 0:
        tier = tier_for(organization)
        raise QuotaExceeded(
            stack_limit_message(organization),
            code="stack_limit_reached",
            fields={"limit": "syncing_stacks", "tier": tier.name, "limit_stacks": tier.syncing_stacks},
        )


def stack_room(*, organization: Organization) -> int | None:
    """How many more stacks the organization's tier lets it activate (None: no limit, or overflow
    billed). A roster import reads it to refuse a file that would pass the limit before it creates
    anything.

    Stacks sit below billing, so the subscription is read through the organization: billing.services
    keeps `Organization.overflow_tier` in step with it, and a lapsed, expired or downgraded plan
    clears it, after which new stacks past the count are refused again (existing ones keep syncing)."""
    tier = tier_for(organization)
    if tier.syncing_stacks is None or organization.overflow_billed:
        return None
    active = Stack.objects.filter(organization_id=organization.pk, status=Stack.Status.ACTIVE).count()
    return max(0, tier.syncing_stacks - active)
