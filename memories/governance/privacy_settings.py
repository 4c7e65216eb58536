"""A school's privacy settings, read and changed in one audited call (docs/privacy.md "The Privacy page").

Four settings of `accounts.Organization`, each with its own validator:

* `retention_days` — {kind: days} kept after a memory's creation (`memories.lifecycle.ttl`, enforced
  by the TTL job); a kind left out has no limit;
* `redaction_categories` — the PII categories redacted at ingest (`memories.privacy.redaction`); secrets are
  redacted whatever this says. Stored None means "every PII category, including any added later";
  choosing all of them stores None too, so the two cannot drift apart;
* `empty_grants_policy` — what an empty `access_grants` list means for school staff ("school":
  staff who reach the student may read it; "owner": only the stack's own keys);
* `keep_raw_originals` — keep raw entries' unredacted text, encrypted at rest;
* `provision_stacks_on_push` — a school key's first kernle push to an unknown student id creates that
  student's stack, within the plan's limits (docs/kernle-protocol.md §3.4). Not privacy as such, but
  it decides whose memory the school starts keeping, so it is chosen, and audited, here.
* the families' settings (docs/consent.md): `consent_required` (agents write to a student's stack
  only with a guardian's consent in force), `consent_text` (what a guardian agrees to; empty: the
  default text, memories.governance.consent), `consent_withdrawal` ("keep" or "erase" the memory when
  consent is withdrawn), `guardians_may_pause` and `guardian_request_days` (the days a school gives
  itself to answer a guardian's request: memories.governance.guardian_requests).

Who may read or change them is `accounts.selectors.ensure_may_manage_organization` (school admins
and writable school keys), asked here so the API and the dashboard cannot differ. A change is one
row update and one audit event (`privacy.updated`, the changed settings before and after: settings,
never memory content). `policy_sections` writes the school's retention policy in plain words —
what is kept, for how long, who sees it, what erasure does — for the dashboard and the API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import Principal
from accounts.selectors import ensure_may_manage_organization
from accounts.services import audit_record
from memories.governance.erasure import ASYNC_THRESHOLD
from memories.lifecycle.ttl import DEFAULT_RETENTION_DAYS, retention_validated
from memories.models import MemoryKind
from memories.privacy.redaction.policy import redaction_categories_validated
from memories.privacy.redaction.rules import PII_CATEGORIES
from memoryhub.errors import InvalidInput

FIELDS = ("retention_days", "redaction_categories", "empty_grants_policy", "keep_raw_originals",
          "provision_stacks_on_push", "consent_required", "consent_text", "consent_withdrawal", "guardians_may_pause",
          "guardian_request_days")
CONSENT_TEXT_MAX = 5000
REQUEST_DAYS_MAX = 90
AUDIT_ACTION = "privacy.updated"

# How the policy names each kind (plural, for "Raw entries: 365 days").
KIND_LABELS: dict[str, str] = {
    MemoryKind.RAW: "Raw entries", MemoryKind.EPISODE: "Episodes", MemoryKind.NOTE: "Notes",
    MemoryKind.BELIEF: "Beliefs", MemoryKind.VALUE: "Values", MemoryKind.GOAL: "Goals",
    MemoryKind.DRIVE: "Drives", MemoryKind.RELATIONSHIP: "Relationships", MemoryKind.PLAYBOOK: "Playbooks",
}

# How the dashboard and the policy name each PII category (memories.privacy.redaction.rules.PII_CATEGORIES).
CATEGORY_LABELS: dict[str, str] = {"EMAIL": "e-mail addresses", "PHONE": "phone numbers",
                                   "IP_ADDRESS": "IP addresses"}


@dataclass(frozen=True)
class PrivacySettings:
    retention_days: dict[str, int]
    redaction_categories: list[str]  # what is redacted now (None in the column: all of PII_CATEGORIES)
    empty_grants_policy: str
    keep_raw_originals: bool
    provision_stacks_on_push: bool = False
    consent_required: bool = False
    consent_text: str = ""
    consent_withdrawal: str = Organization.ConsentWithdrawal.KEEP.value
    guardians_may_pause: bool = True
    guardian_request_days: int = 10
    # When an admin last saved the retention: a kind without a limit is then their choice (read only).
    retention_reviewed_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def values(self) -> dict[str, Any]:
        """The settings alone (what a change may name)."""
        return {name: getattr(self, name) for name in FIELDS}


def _default(name: str) -> Any:
    field = Organization._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field.get_default()


ACCESS_LOG_DEFAULT_DAYS: int = _default("access_log_retention_days")

# What a school that never changed anything has (the model's defaults, and the TTL module's).
DEFAULTS = PrivacySettings(
    retention_days=dict(DEFAULT_RETENTION_DAYS),
    redaction_categories=list(PII_CATEGORIES),
    empty_grants_policy=str(_default("empty_grants_policy")),
    keep_raw_originals=_default("keep_raw_originals"),
    provision_stacks_on_push=_default("provision_stacks_on_push"),
    consent_required=_default("consent_required"),
    consent_text=str(_default("consent_text")),
    consent_withdrawal=str(_default("consent_withdrawal")),
    guardians_may_pause=_default("guardians_may_pause"),
    guardian_request_days=_default("guardian_request_days"),
)


def _of(organization: Organization) -> PrivacySettings:
    chosen = organization.redaction_categories
    return PrivacySettings(
        retention_days=dict(organization.retention_days or {}),
        redaction_categories=list(PII_CATEGORIES) if chosen is None else [c for c in PII_CATEGORIES if c in chosen],
        empty_grants_policy=str(organization.empty_grants_policy),
        keep_raw_originals=organization.keep_raw_originals,
        provision_stacks_on_push=organization.provision_stacks_on_push,
        consent_required=organization.consent_required,
        consent_text=organization.consent_text,
        consent_withdrawal=str(organization.consent_withdrawal),
        guardians_may_pause=organization.guardians_may_pause,
        guardian_request_days=organization.guardian_request_days,
        retention_reviewed_at=organization.retention_reviewed_at,
    )


def school_policy(organization: Organization) -> list[PolicySection]:
    """The school's written policy as its settings make it, for whoever may read it (a guardian's
    child page shows it: docs/guardians.md); the settings themselves stay the admins'."""
    return policy_sections(_of(organization), school=organization.name,
                           access_log_days=organization.access_log_retention_days)


def privacy_settings_get(principal: Principal) -> PrivacySettings:
    """The caller's school's settings (school admins and school keys; anyone else 403)."""
    ensure_may_manage_organization(principal)
    return _of(principal.organization)


def _categories(value: Any) -> list[str] | None:
    chosen = redaction_categories_validated(value)
    if chosen is not None and set(chosen) >= set(PII_CATEGORIES):
        return None  # all of them: stored as "all", so a category added later is on as well
    return chosen


def _policy(value: Any) -> str:
    if value not in Organization.EmptyGrantsPolicy.values:
        raise InvalidInput("Unknown empty-grants policy.", code="invalid",
                           fields={"empty_grants_policy": [
                               f"One of: {', '.join(Organization.EmptyGrantsPolicy.values)}."]})
    return str(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput("keep_raw_originals must be true or false.", code="invalid",
                           fields={"keep_raw_originals": ["Must be true or false."]})
    return value


def _provisioning(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput("provision_stacks_on_push must be true or false.", code="invalid",
                           fields={"provision_stacks_on_push": ["Must be true or false."]})
    return value


def _boolean(name: str) -> Callable[[Any], bool]:
    def validated(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidInput(f"{name} must be true or false.", code="invalid",
                               fields={name: ["Must be true or false."]})
        return value
    return validated


def _consent_text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > CONSENT_TEXT_MAX or "\x00" in value:
        raise InvalidInput("Invalid consent text.", code="invalid",
                           fields={"consent_text": [
                               f"Text of at most {CONSENT_TEXT_MAX} characters (empty: the default)."]})
    return value.strip()


def _withdrawal(value: Any) -> str:
    if value not in Organization.ConsentWithdrawal.values:
        raise InvalidInput("Unknown consent withdrawal choice.", code="invalid",
                           fields={"consent_withdrawal": [
                               f"One of: {', '.join(Organization.ConsentWithdrawal.values)}."]})
    return str(value)


def _request_days(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= REQUEST_DAYS_MAX:
        raise InvalidInput("Invalid number of days for guardians' requests.", code="invalid",
                           fields={"guardian_request_days": [f"Whole days, 1 to {REQUEST_DAYS_MAX}."]})
    return value


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "retention_days": retention_validated, "redaction_categories": _categories, "empty_grants_policy": _policy,
    "keep_raw_originals": _flag, "provision_stacks_on_push": _provisioning,
    "consent_required": _boolean("consent_required"), "consent_text": _consent_text,
    "consent_withdrawal": _withdrawal, "guardians_may_pause": _boolean("guardians_may_pause"),
    "guardian_request_days": _request_days}


def privacy_settings_validated(changes: Any) -> dict[str, Any]:
    """`changes` checked: known settings only (else 400 `unknown_field`), each value by its own
    validator, every error at once as one 400 (field → messages). Returns the values as stored."""
    if not isinstance(changes, Mapping):
        raise InvalidInput("Send an object of settings.", code="invalid",
                           fields={"non_field_errors": [f"Expected an object with any of: {', '.join(FIELDS)}."]})
    unknown = sorted(str(name) for name in changes if name not in _VALIDATORS)
    if unknown:
        raise InvalidInput("Unknown settings; nothing was changed.", code="unknown_field",
                           fields={name: [f"Unknown setting; one of: {', '.join(FIELDS)}."] for name in unknown})
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    for name, value in changes.items():
        try:
            values[name] = _VALIDATORS[name](value)
        except InvalidInput as error:
            for field_name, messages in (error.fields or {name: [error.message]}).items():
                # The retention validator names kinds; say which setting they belong to.
                key = field_name if field_name == name else f"{name}.{field_name}"
                errors.setdefault(key, []).extend(messages if isinstance(messages, list) else [str(messages)])
    if errors:
        raise InvalidInput("The privacy settings are invalid; nothing was changed.", code="invalid_privacy_settings",
                           fields=errors)
    return values


def privacy_settings_update(*, principal: Principal, changes: Any,
                            ip: str | None = None) -> PrivacySettings:
    """Change any of the settings (those not named keep their value) in one transaction with
    one audit event naming what changed. Invalid input changes nothing (400). Saving the retention,
    even unchanged, records that an admin chose it (`retention_reviewed_at`): a kind left without a
    limit is then deliberate, and the first such confirmation is audited too."""
    ensure_may_manage_organization(principal)
    values = privacy_settings_validated(changes)
    with transaction.atomic():
        organization = Organization.objects.select_for_update().get(pk=principal.organization.pk)
        before = {name: getattr(organization, name) for name in values}
        changed = {name: {"from": before[name], "to": value} for name, value in values.items()
                   if before[name] != value}
        confirmed = "retention_days" in values and organization.retention_reviewed_at is None
        update_fields = list(changed)
        if "retention_days" in values:
            organization.retention_reviewed_at = timezone.now()
            update_fields.append("retention_reviewed_at")
        for name in changed:
            setattr(organization, name, values[name])
        organization.save(update_fields=update_fields)
        if changed or confirmed:
            metadata: dict[str, Any] = {"changed": changed}
            if confirmed:
                metadata["retention_confirmed"] = True
            audit_record(organization=organization, action=AUDIT_ACTION, principal=principal,
                         target_type="organization", target_id=organization.slug, ip=ip,
                         metadata=metadata)
    return _of(organization)


# --- the written policy ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySection:
    title: str
    paragraphs: tuple[str, ...]


def _days(days: int) -> str:
    if days % 365 == 0:
        years = days // 365
        return f"{days} days ({years} year{'s' if years > 1 else ''})"
    return f"{days} day{'s' if days > 1 else ''}"


def retention_rows(settings: PrivacySettings) -> list[tuple[str, str, int | None]]:
    """(kind, label, days or None for no limit), one per memory kind in the kinds' order."""
    return [(kind, KIND_LABELS.get(kind, kind), settings.retention_days.get(kind)) for kind in MemoryKind.values]


def policy_sections(settings: PrivacySettings, *, school: str,
                    access_log_days: int = ACCESS_LOG_DEFAULT_DAYS) -> list[PolicySection]:
    """The school's retention policy in plain words, as its settings make it (dashboard and API)."""
    categories = ", ".join(CATEGORY_LABELS.get(c, c) for c in settings.redaction_categories)
    redacts = (f"{school} also has personal details of these kinds replaced: {categories}."
               if categories else f"{school} has chosen to keep personal details such as e-mail addresses as "
                                  "written (secrets are still replaced).")
    originals = ("The original, unredacted text of raw entries is kept as well, encrypted (AES-256-GCM) so that "
                 "only MemoryHub with the operator's key can read it; school admins and the student's own agent "
                 "may open it." if settings.keep_raw_originals else
                 "The original text of what was redacted is not kept anywhere: only the redacted text is stored.")
    limits = [f"{label}: {_days(days)} after they are written." for _, label, days in retention_rows(settings) if days]
    unlimited = [label.lower() for _, label, days in retention_rows(settings) if not days]
    how_long = [*limits]
    until = ("they are kept until the student's agent deletes them or sets an expiry, or the school erases "
             "them.")
    if len(unlimited) == len(KIND_LABELS):
        how_long.append(f"No time limit is set for any kind of memory: {until}")
    elif unlimited:
        how_long.append(f"No time limit is set for {', '.join(unlimited)}: {until}")
    if unlimited:
        chosen = (f"{school}'s admins chose this on {settings.retention_reviewed_at:%-d %B %Y}."
                  if settings.retention_reviewed_at else
                  f"{school} has not reviewed this yet: its admins are asked to set a limit, or to confirm "
                  "keeping them without one, on the Privacy page.")
        how_long.append("Keeping memories without a time limit is meant for deployments that COPPA does not "
                        "bind: a school serving children under 13 in the United States may keep their personal "
                        "information only as long as reasonably necessary, never indefinitely, and sets a "
                        "limit for every kind. " + chosen)
    if limits:
        how_long.append("MemoryHub checks these limits every few minutes and deletes what is older, with its "
                        "history of changes — protected memories included.")
    how_long.append("A memory the tutor has \"forgotten\" (faded from use) is hidden from the agent but still "
                    "stored, and can be recovered, until a time limit or an erasure removes it.")
    staff = ("A memory that does not say who may read it can be read by the school's admins and by the teachers "
             "assigned to the student." if settings.empty_grants_policy == Organization.EmptyGrantsPolicy.SCHOOL
             else "A memory that does not say who may read it can be read only by the student's own agent, not by "
                  "school staff.")
    sections = [
        PolicySection("What is kept", (
            "For each student, MemoryHub keeps what the school's AI tutor agents write to the student's memory: "
            "raw entries, episodes, notes, beliefs, values, goals, drives, relationships and playbooks, each "
            "with its history of changes, plus the agent's latest checkpoint and its settings.",
            "Secrets — API keys, access tokens, card numbers — are replaced by a placeholder such as "
            "<REDACTED:API_KEY> before anything is stored, searched or sent on; a private key or an "
            "authorization header is refused and nothing is stored. " + redacts,
            originals,
        )),
        PolicySection("How long it is kept", tuple(how_long)),
        PolicySection("Who can see it", (
            "The student's own agent sees all of the student's memory. A memory that names who may read it is "
            "shown only to them. " + staff,
            "Every export, erasure and change of these settings is recorded in the school's audit log.",
            "Every memory records which agent, key or person wrote it and each change to it. Every time a "
            "memory is shown to an agent, a staff member or a connected service, the access log records who "
            f"saw it, when and how — never its text — and keeps that for {access_log_days} days.",
        )),
        PolicySection("What erasure does", (
            "A school admin can erase a student, or a single memory, at any time — for example when a parent "
            "asks. Erasure is immediate and cannot be undone: the memories, their history, their search "
            "indexes, the checkpoint, the agent's settings and its sync state are deleted (a student with more "
            f"than {ASYNC_THRESHOLD:,} memories is erased in the background within minutes).",
            "What remains is a certificate of erasure — what was erased (counts by kind), when, by whom and at "
            "whose request, with a digest anyone can check later — an audit entry without any memory content, "
            "and, for each erased memory, a fingerprint of its id (never its text) so that a device holding an "
            "old copy cannot put it back.",
            "Deleted data can stay in the database's free space and in backups until those are overwritten or "
            "expire.",
        )),
        PolicySection("Getting a copy", (
            "A school admin or an assigned teacher can download everything stored about a student as one archive "
            "(every memory with all its fields, the history of changes, the checkpoint and settings, and a "
            "description of the format), for example to answer a parent's request for access.",
        )),
    ]
    if settings.consent_required:
        sections.insert(1, PolicySection("Parents' consent", (
            f"{school} asks a parent or guardian for consent before a student's tutor keeps a memory: until a "
            "guardian consents on their child's page, or the school records consent given on paper, nothing is "
            "written to the student's memory.",
            "A guardian may withdraw consent at any time; the tutor then stops adding to the memory at once, "
            + ("and the school erases what it holds, with a certificate of erasure."
               if settings.consent_withdrawal == Organization.ConsentWithdrawal.ERASE else
               "and what is stored stays under the time limits below, readable by the family, until it expires "
               "or the school erases it on request."),
        )))
    return sections
