"""Privacy grants: which memories of a stack a requester other than the stack's own credentials sees
(docs/privacy.md "Privacy grants").

A memory carries `access_grants`, a list of entity ids (Kernle Phase 8). A requester is described by
an `Audience`: the entity ids it answers to and what its school says an empty list means.

* The stack's own credentials — a key issued as the stack's own agent key (`ApiKey.stack_agent`, an
  explicit, audited choice), or a JWT issued for such a key — see all of the stack: `audience_for`
  returns None for them, and None means "no grants predicate at all", so the agent's own reads are
  exactly as fast as before.
* Anyone else — a school key, a signed-in admin or teacher, a webhook endpoint, and any other key
  bound to the stack — sees a memory only when `access_grants && <its ids>` (Postgres array
  overlap) or, under the school policy "school" (the default), when `access_grants` is empty. Under
  "owner" an empty list means "the stack's own credentials only".

Entity ids (every requester also answers to `*` and to its school, `org:<school public id>`):

    signed-in admin / teacher / billing user   human:<user public id>, role:admin|teacher|billing
    signed-in guardian                         under the school's `guardian_view` "agent" (the
                                               default): none, they see what the student's own
                                               agent sees (None, like the stack's own credentials);
                                               under "granted": human:<user public id>,
                                               role:guardian and `*` only — not the school's
                                               `org:` id, and an empty list never admits them
                                               (docs/guardians.md "What a guardian sees")
    school (organization-wide) key             key:<key public id>, role:school_key
    webhook endpoint                           webhook:<endpoint public id>, role:webhook
    stack-bound key, not the stack's agent     its issuer's: the ids of the school key that issued
                                               it (key:<that key's id>, role:school_key), else those
                                               of the person it acts as (human:<user>, role:<their
                                               current role>)

So a key never reads more of a stack than whoever issued it (docs/privacy.md "Keys and the grants").

The user's public id (`usr_…`) is the stable one: an e-mail address can change or be reused.

This module is the ONE predicate builder: `grants_q` for ORM querysets and `grants_sql` for the raw
SQL paths (search, load, pull). Every read a non-self requester can make goes through one of them,
inside SQL and before any LIMIT, so a hidden memory never takes a slot in a page or a result list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from accounts.models import Membership, Organization
from accounts.principal import Principal

EVERYONE = "*"
ROLE_SCHOOL_KEY = "school_key"
ROLE_WEBHOOK = "webhook"
# Keys of the parameters grants_sql adds; chosen not to collide with the callers' own names.
IDS_PARAM = "grant_ids"


@dataclass(frozen=True)
class Audience:
    """A requester as the grants see it (hashable: the live pages key shared renders by it)."""

    entity_ids: tuple[str, ...]
    # True under the school policy "school": an empty `access_grants` admits this requester.
    empty_admits: bool


def _audience(organization: Organization, *ids: str) -> Audience:
    policy = organization.empty_grants_policy or Organization.EmptyGrantsPolicy.SCHOOL
    return Audience(entity_ids=(*ids, f"org:{organization.public_id}", EVERYONE),
                    empty_admits=policy == Organization.EmptyGrantsPolicy.SCHOOL)


def audience_for(principal: Principal, *, stack_id: int | None = None) -> Audience | None:
    """The principal's audience; None for the stack's own credentials (they see everything).

    The stack's own agent key only ever reaches its own stack (stacks.selectors), so it is "own"
    unless `stack_id` names another stack. Any other stack-bound key gets its issuer's audience:
    the school key that issued it, or the person it acts as with their current role."""
    key = principal.api_key
    if key is None:
        return _person(principal)
    if principal.bound_stack_id is None:
        return _audience(principal.organization, f"key:{key.public_id}", f"role:{ROLE_SCHOOL_KEY}")
    if principal.is_stack_agent and stack_id in (None, principal.bound_stack_id):
        return None
    if key.issued_by_key:
        return _audience(principal.organization, f"key:{key.issued_by_key}", f"role:{ROLE_SCHOOL_KEY}")
    return _person(principal)


def _person(principal: Principal) -> Audience | None:
    role = principal.role or Membership.Role.BILLING  # (a Principal always has one; fail towards the least)
    if role == Membership.Role.GUARDIAN:
        return _guardian(principal)
    return _audience(principal.organization, f"human:{principal.user.public_id}", f"role:{role}")


def _guardian(principal: Principal) -> Audience | None:
    """A signed-in guardian, who reaches only their linked children (stacks.selectors). The school
    chooses what of a child's stack they read (`Organization.guardian_view`): everything the
    student's own agent reads (None: no predicate), or only memories granted to them. A guardian is
    not school staff: `org:<school>` and the "school" empty-grants policy never admit them."""
    if principal.organization.guardian_view != Organization.GuardianView.GRANTED:
        return None
    return Audience(entity_ids=(f"human:{principal.user.public_id}", f"role:{Membership.Role.GUARDIAN.value}",
                                EVERYONE), empty_admits=False)


def audience_for_webhook(*, endpoint_public_id: str, organization: Organization) -> Audience:
    """What a webhook endpoint of `organization` may receive."""
    return _audience(organization, f"webhook:{endpoint_public_id}", f"role:{ROLE_WEBHOOK}")


def grants_q(audience: Audience | None, *, prefix: str = "") -> Q | None:
    """The ORM predicate (None: no predicate, own credentials). `prefix` reaches a memory through a
    relation, e.g. "memory__" from a revision."""
    if audience is None:
        return None
    admitted = Q(**{f"{prefix}access_grants__overlap": list(audience.entity_ids)})
    if audience.empty_admits:
        admitted |= Q(**{f"{prefix}access_grants": []})
    return admitted


def grants_filter(queryset: Any, audience: Audience | None, *, prefix: str = "") -> Any:
    """`queryset` narrowed to what `audience` sees (unchanged for own credentials)."""
    predicate = grants_q(audience, prefix=prefix)
    return queryset if predicate is None else queryset.filter(predicate)


def grants_sql(audience: Audience | None, alias: str = "m") -> tuple[str, dict[str, Any]]:
    """The raw-SQL predicate over `<alias>.access_grants` with its named parameters; ("TRUE", {})
    for own credentials. Callers add it with AND: `WHERE … AND {sql}`."""
    if audience is None:
        return "TRUE", {}
    column = f"{alias}.access_grants" if alias else "access_grants"
    sql = f"{column} && %({IDS_PARAM})s::text[]"
    if audience.empty_admits:
        sql = f"({sql} OR cardinality({column}) = 0)"
    return sql, {IDS_PARAM: list(audience.entity_ids)}
