"""Raw entries' original text, kept only when the school opted in, and only encrypted at rest.

docs/privacy.md, "Encryption at rest". Redaction (memories.privacy.redaction) runs before anything is
stored, so by default a raw entry's secrets and personal data exist nowhere on the server. A school
may opt in (`Organization.keep_raw_originals`) to also keep each raw entry's text *as submitted*:
then the write kernel hands this module the original of every raw entry that redaction changed,
and it is sealed (memoryhub.encryption: AES-256-GCM, random 96-bit nonce, the memory id and the
stack id as associated data, the key id on the row) into `RawOriginal`, in the writing transaction.

* **Never a secret.** An original keeps what the school's PII categories redacted (e-mail
  addresses, phone numbers, IP addresses), never a secret: keys, tokens, JWTs and card numbers are
  redacted in it as in the stored text (`memories.privacy.redaction.engine.redact_secrets`), when the kernel
  builds it, again when it is sealed, and when one sealed before that rule is read or re-sealed.
* **Only when redaction changed more than secrets.** Otherwise the stored text *is* the original,
  and a second, encrypted copy would add risk and storage for nothing.
* **A text change replaces the original**: a new one when redaction changed the new text,
  none when it did not (an original never describes another version than the stored one). A
  deleted memory (a kernle delete keeps a tombstone row) loses its original at once; erasure and
  the TTL purge remove it with the memory.
* **No key, no original**: an opted-in school's write that needs a seal while no key is
  configured (production without `MEMORYHUB_ENCRYPTION_KEYS`) is refused, 503
  `encryption_key_missing`, and nothing of it is stored — never the plaintext.
* **Reading one back** (`raw_original_text`): the stack's own credentials and the school's admins
  (signed in; not school keys, not teachers), audited without any text. A row that cannot be
  opened — its key id is not configured, the wrong key, a changed or moved blob — is 503
  `original_unreadable` ("wrong key or tampered data", naming the key id), never ciphertext.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import Membership, Organization
from accounts.principal import Principal
from accounts.services import audit_record
from memories.models import Memory, RawOriginal
from memories.privacy.redaction.engine import redact_secrets
from memoryhub.encryption import (
    DecryptionFailed,
    EncryptionUnavailable,
    Keyring,
    open_sealed,
    seal,
)
from memoryhub.errors import NotFound, ServiceUnavailable

logger = logging.getLogger(__name__)

READ_ACTION = "memory.original_read"


class OriginalUnreadable(ServiceUnavailable):
    code = "original_unreadable"


def associated_data(memory_id: Any, stack_id: int) -> bytes:
    """What a sealed original belongs to: its memory and that memory's stack."""
    return f"memoryhub raw-original v1|memory:{memory_id}|stack:{stack_id}".encode()


def _sealed(memory_id: Any, stack_id: int, text: str, now: datetime, keyring: Keyring | None = None) -> RawOriginal:
    # Whatever a caller hands in, no secret is sealed (the kernel already took them out: a no-op then).
    key_id, blob = seal(redact_secrets(text).encode(), associated_data=associated_data(memory_id, stack_id),
                        keyring=keyring)
    return RawOriginal(memory_id=memory_id, key_id=key_id, ciphertext=blob, sealed_at=now)


def _keeps_originals(stack_id: int) -> bool:
    return bool(Organization.objects.filter(stacks__pk=stack_id).values_list("keep_raw_originals", flat=True)
                .first())


def keep_originals(*, stack_id: int, originals: Mapping[Any, str], stale: Collection[Any] = ()) -> None:
    """The write kernel's step, in the writing transaction, after the memory rows are written.

    `originals`: memory id → text as submitted, for the raw rows of this write whose text redaction
    changed. `stale`: stored raw rows whose kept original no longer describes them (text changed,
    or deleted). Sealed when the school opted in — one upsert for the whole write — and the stale
    ones that got no new original deleted in one statement. Costs nothing when both are empty.
    """
    drop = set(stale)
    if originals and _keeps_originals(stack_id):
        now = timezone.now()
        try:
            rows = [_sealed(memory_id, stack_id, text, now) for memory_id, text in originals.items()]
        except EncryptionUnavailable:
            raise ServiceUnavailable(
                "This school keeps raw entries' original text encrypted, but no encryption key is configured "
                "(MEMORYHUB_ENCRYPTION_KEYS); nothing was stored.", code="encryption_key_missing") from None
        RawOriginal.objects.bulk_create(rows, update_conflicts=True, unique_fields=["memory"],
                                        update_fields=["key_id", "ciphertext", "sealed_at"])
        drop.difference_update(originals)
    if drop:
        RawOriginal.objects.filter(memory_id__in=drop).delete()


# --- reading one back ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OriginalText:
    text: str
    key_id: str
    sealed_at: datetime


def may_read_originals(principal: Principal, stack_id: int) -> bool:
    """The stack's own agent credentials (a key issued as the student's own agent, or its kernle
    token) and the school's signed-in admins. Not a school key (an integration, not a person
    answering for the read), not a teacher, and not a key bound to the stack without the agent
    choice: it reads as its issuer, and an issuing teacher may not read originals
    (docs/privacy.md "Keys and the grants")."""
    if principal.api_key is not None:
        return principal.is_stack_agent and principal.bound_stack_id == stack_id
    return principal.role == Membership.Role.ADMIN


def open_original(row: RawOriginal, *, stack_id: int, keyring: Keyring | None = None) -> str:
    """The plaintext of a kept original, or DecryptionFailed. Without secrets: a row sealed before
    originals were cleared of them shows (and, re-sealed, keeps) none either."""
    return redact_secrets(open_sealed(row.ciphertext, key_id=row.key_id,
                                      associated_data=associated_data(row.memory_id, stack_id),
                                      keyring=keyring).decode())


@transaction.atomic
def raw_original_text(principal: Principal, memory: Memory) -> OriginalText:
    """The original text of `memory`, which the caller resolved through stacks.selectors (its stack
    is one the principal reaches). 404 when none is kept or the caller may not read originals."""
    if memory.stack.organization_id != principal.organization.pk or not may_read_originals(principal, memory.stack_id):
        raise NotFound("No original text is kept for this memory.", code="original_not_found")
    row = RawOriginal.objects.filter(memory_id=memory.pk).first()
    if row is None:
        raise NotFound("No original text is kept for this memory.", code="original_not_found")
    try:
        text = open_original(row, stack_id=memory.stack_id)
    except DecryptionFailed as exc:
        logger.warning("raw original of memory %s unreadable (key id %s)", memory.pk, exc.key_id)
        raise OriginalUnreadable(f"The original text cannot be opened: {exc}.") from None
    audit_record(organization=principal.organization, action=READ_ACTION, principal=principal,
                 target_type="memory", target_id=str(memory.pk),
                 metadata={"stack": memory.stack.slug, "key_id": row.key_id})
    return OriginalText(text=text, key_id=row.key_id, sealed_at=row.sealed_at)


# --- rotation ------------------------------------------------------------------------------------------


@dataclass
class Rotation:
    """Progress of `reseal_batch` calls (manage.py rotate_encryption_key)."""

    resealed: int = 0
    unreadable: dict[str, int] | None = None  # key id → rows that could not be opened
    after: Any = None  # the last memory id looked at: the next batch starts behind it


def rows_to_reseal(keyring: Keyring) -> dict[str, int]:
    """Rows not sealed with the current key, counted by key id."""
    counts: dict[str, int] = {}
    for key_id in (RawOriginal.objects.exclude(key_id=keyring.current_id).values_list("key_id", flat=True)
                   .order_by().distinct()):
        counts[key_id] = RawOriginal.objects.filter(key_id=key_id).count()
    return counts


def reseal_batch(rotation: Rotation, *, keyring: Keyring, batch_size: int) -> int:
    """Re-seal up to `batch_size` rows not sealed with the current key, in memory-id order behind
    `rotation.after`, in one transaction (rows locked, so a concurrent write's new seal is not
    overwritten with an old text). Returns how many rows were looked at (0: done). A row that cannot
    be opened is counted in `rotation.unreadable` and left as it is."""
    current_id, _ = keyring.sealing_key()
    with transaction.atomic():
        batch = RawOriginal.objects.exclude(key_id=current_id).select_for_update(of=("self",)).order_by("memory_id")
        if rotation.after is not None:
            batch = batch.filter(memory_id__gt=rotation.after)
        rows = list(batch.select_related("memory").only("memory_id", "key_id", "ciphertext", "memory__stack_id")
                    [:batch_size])
        if not rows:
            return 0
        now = timezone.now()
        resealed: list[RawOriginal] = []
        for row in rows:
            stack_id = row.memory.stack_id
            try:
                text = open_original(row, stack_id=stack_id, keyring=keyring)
            except DecryptionFailed as exc:
                unreadable = rotation.unreadable if rotation.unreadable is not None else {}
                unreadable[exc.key_id] = unreadable.get(exc.key_id, 0) + 1
                rotation.unreadable = unreadable
                continue
            resealed.append(_sealed(row.memory_id, stack_id, text, now, keyring))
        if resealed:
            RawOriginal.objects.bulk_update(resealed, ["key_id", "ciphertext", "sealed_at"])
        rotation.resealed += len(resealed)
        rotation.after = rows[-1].memory_id
        return len(rows)
