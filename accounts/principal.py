"""Who is calling: the one object every access decision is made from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accounts.models import ApiKey, Membership, Organization, User


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request (set as DRF's `request.auth`).

    * an agent key: `api_key` set and `bound_stack_id` set — reaches exactly that stack;
    * a school (organization) key: `api_key` set, `bound_stack_id` None — any stack of `organization`;
    * a dashboard user: `api_key` None, `role` from their membership — admins see the whole
      organization, teachers their assigned stacks, billing users no stack at all.

    For a key, `role` is the current role of the person it acts as (its issuer), which is what a
    stack-bound key that is not the stack's own agent key answers to in the privacy grants
    (memories.privacy.grants, docs/privacy.md "Keys and the grants").
    """

    user: User
    organization: Organization
    api_key: ApiKey | None = None
    bound_stack_id: int | None = None
    read_only: bool = False
    role: str = Membership.Role.ADMIN
    # Identifies the credential (API-key id or JWT jti) for per-credential sync watermarks.
    credential_id: str = ""

    @property
    def is_key(self) -> bool:
        return self.api_key is not None

    @property
    def is_stack_bound(self) -> bool:
        return self.bound_stack_id is not None

    @property
    def is_stack_agent(self) -> bool:
        """The stack's own agent credential: a key issued as the student's own agent (or a token of
        one). It reads every memory of its stack; any other key reads what its issuer may read."""
        return self.api_key is not None and self.bound_stack_id is not None and self.api_key.stack_agent

    @property
    def is_org_wide(self) -> bool:
        """A school key or a school admin: may act on any stack of the organization."""
        if self.api_key is not None:
            return self.bound_stack_id is None
        return self.role == Membership.Role.ADMIN


def principal_of(request: Any) -> Principal:
    """The Principal of an authenticated DRF request (views run IsAuthenticated first)."""
    from memoryhub.errors import NotAuthenticated

    principal = getattr(request, "auth", None)
    if not isinstance(principal, Principal):
        raise NotAuthenticated("Authentication required.")
    return principal
