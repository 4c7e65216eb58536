"""The one place that decides who may touch which stack.

Every API view, dashboard view and websocket resolves stacks through these functions. A stack
the caller may not see is a 404 — never its data, never a hint that it exists. A read-only key
trying to write is a 403 (it can already see the stack); writing to an archived stack is a 409.
"""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.models import Membership
from accounts.principal import Principal
from memoryhub.errors import Conflict, Forbidden, NotFound
from stacks.models import Stack


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
    return stacks.none()  # billing users see no memory at all


def stack_for_principal(principal: Principal, slug: str, *, write: bool = False, lock: bool = False) -> Stack:
    """The stack `slug` of the caller's organization, if the caller may reach it.

    `write=True` also refuses read-only credentials (403) and archived stacks (409).
    `lock=True` takes a row lock on the stack (caller must be inside a transaction); used to
    serialise pushes per stack.
    """
    if not plausible_identifier(slug, max_length=100):
        # PostgreSQL cannot even compare a NUL byte; such an id names nothing.
        raise NotFound("Stack not found.", code="stack_not_found")
    queryset = stacks_visible_to(principal).filter(slug=slug)
    if lock:
        # Lock only the stack row: the joined organization row must stay free, or every push in
        # a school would queue behind every other.
        queryset = queryset.select_for_update(of=("self",))
    stack = queryset.select_related("organization").first()
    if stack is None:
        raise NotFound("Stack not found.", code="stack_not_found")
    if write:
        ensure_writable(principal, stack)
    return stack


def plausible_identifier(value: object, *, max_length: int) -> bool:
    """Could `value` name a row at all? (A string of sane length without NUL bytes.)"""
    return isinstance(value, str) and 0 < len(value) <= max_length and "\x00" not in value


def ensure_writable(principal: Principal, stack: Stack) -> None:
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    if stack.is_archived:
        raise Conflict("The stack is archived; it keeps its data but refuses writes.", code="stack_archived")
