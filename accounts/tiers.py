"""The one table of tiers and what each allows (docs/kernle-protocol.md §7.4), and an organization's tier.

Every tier name an organization can carry is mapped here explicitly: an unknown name is an
error, never a silent fallback to some other tier's limits (the legacy backend's pitfall, §7.4).
`None` means "no limit". The per-key rate limits are the same on every plan; the school's share of
the service (all its keys together) grows with it.

Why this lives in accounts, not billing: the tier is a property of the organization
(`Organization.tier`), and two layers enforce what it allows — stacks (how many active stacks,
checked by `stack_create`/`stack_unarchive`) and billing (storage, through `billing.entitlements`).
Billing sits above stacks (it reads `Stack.bytes_used`), so a table stacks could read could not
live in billing without an import cycle. This module is pure data plus one lookup; it imports
only the Organization model and the error types, so every layer above accounts may read it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from accounts.models import Organization
from memoryhub.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

MB = 1024 * 1024
GB = 1024 * MB


@dataclass(frozen=True)
class Tier:
    name: str
    storage_bytes: int | None  # bytes of stored memories per organization
    syncing_stacks: int | None  # active stacks per organization
    # Human label for error messages ("free: 10 MB").
    storage_label: str
    # The school's share of the service: how many times `settings.THROTTLE_SCHOOL_RATE` all its
    # authenticated requests together may make (accounts/throttles.py SchoolThrottle).
    request_share: int | None = 1


TIERS: dict[str, Tier] = {
    tier.name: tier
    for tier in (
        Tier(name="free", storage_bytes=10 * MB, syncing_stacks=1, storage_label="10 MB"),
        Tier(name="core", storage_bytes=100 * MB, syncing_stacks=3, storage_label="100 MB", request_share=2),
        Tier(name="pro", storage_bytes=1 * GB, syncing_stacks=10, storage_label="1 GB", request_share=4),
        Tier(name="enterprise", storage_bytes=None, syncing_stacks=None, storage_label="unlimited",
             request_share=10),
        # Operators' and benchmarks' accounts (docs/kernle-protocol.md §7.4 names it).
        Tier(name="unlimited", storage_bytes=None, syncing_stacks=None, storage_label="unlimited",
             request_share=None),
    )
}


def tier_for(organization: Organization) -> Tier:
    """The organization's tier. An unmapped tier name fails closed (503), never "allow"."""
    tier = TIERS.get(organization.tier)
    if tier is None:
        logger.error("organization %s has unmapped tier %r", organization.pk, organization.tier)
        raise ServiceUnavailable("The account's plan cannot be read; retry shortly.", code="tier_unavailable")
    return tier
