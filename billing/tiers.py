"""The one table of tiers and what each allows (kernle-protocol.md §12.7).

Every tier name an organization can carry is mapped here explicitly: an unknown name is an
error, never a silent fallback to some other tier's limits (the legacy backend's pitfall, §12.4).
`None` means "no limit".
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024
GB = 1024 * MB


@dataclass(frozen=True)
class Tier:
    name: str
    storage_bytes: int | None  # bytes of stored memories per organization
    syncing_stacks: int | None  # active stacks per organization
    # Human label for error messages ("free: 10 MB").
    storage_label: str


TIERS: dict[str, Tier] = {
    tier.name: tier
    for tier in (
        Tier(name="free", storage_bytes=10 * MB, syncing_stacks=1, storage_label="10 MB"),
        Tier(name="core", storage_bytes=100 * MB, syncing_stacks=3, storage_label="100 MB"),
        Tier(name="pro", storage_bytes=1 * GB, syncing_stacks=10, storage_label="1 GB"),
        Tier(name="enterprise", storage_bytes=None, syncing_stacks=None, storage_label="unlimited"),
        # Operators' and benchmarks' accounts (kernle-protocol.md §12.4 names it).
        Tier(name="unlimited", storage_bytes=None, syncing_stacks=None, storage_label="unlimited"),
    )
}

DEFAULT_TIER = "free"
