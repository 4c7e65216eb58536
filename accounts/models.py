"""Organizations (schools or personal accounts), people, roles, API keys and the audit log."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models.functions import Lower
from django.utils.crypto import salted_hmac


def new_user_public_id() -> str:
    return f"usr_{secrets.token_hex(6)}"


def new_org_public_id() -> str:
    return f"org_{secrets.token_hex(6)}"


def new_key_public_id() -> str:
    return f"key_{secrets.token_hex(8)}"


# A new school's retention, in days after a memory's creation, per memory kind (the memories app's
# kinds, spelled out here because accounts sits below it; memories' tests check they match). Finite
# for every kind, so a school can sign its policy under COPPA, which forbids keeping children's
# data indefinitely: raw entries (verbatim session text) a school year and a summer, the distilled
# kinds three years, about a school phase (docs/privacy.md "Retention policy").
RAW_RETENTION_DAYS = 365
DISTILLED_RETENTION_DAYS = 3 * 365
RETENTION_KINDS = ("raw", "episode", "note", "belief", "value", "goal", "drive", "relationship", "playbook")


def default_retention_days() -> dict[str, int]:
    return {kind: RAW_RETENTION_DAYS if kind == "raw" else DISTILLED_RETENTION_DAYS for kind in RETENTION_KINDS}


def new_invitation_public_id() -> str:
    return f"inv_{secrets.token_hex(8)}"


class User(AbstractUser):
    """A person (school staff) or an agent builder. `public_id` is what the API and JWTs show."""

    public_id = models.CharField(max_length=32, unique=True, default=new_user_public_id, editable=False)
    email = models.EmailField(blank=True, default="")
    # Bumped to end every session of the user at once (accounts.services.sessions_end: a member
    # removed from a school). Sessions store a hash of it — see get_session_auth_hash.
    session_epoch = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                Lower("email"),
                name="accounts_user_email_ci_unique",
                condition=~models.Q(email=""),
            )
        ]

    # Django keeps a session only while the hash it stored at sign-in still matches this one (it
    # already changes with the password). Mixing in `session_epoch` lets a service end all of a
    # user's sessions with one UPDATE, whatever the session backend. Epoch 0 hashes exactly as
    # Django does, so sessions from before this field stay valid.
    def get_session_auth_hash(self) -> str:
        return self._session_hash(secret=None)

    def get_session_auth_fallback_hash(self) -> Iterator[str]:
        for fallback_secret in settings.SECRET_KEY_FALLBACKS:
            yield self._session_hash(secret=fallback_secret)

    def _session_hash(self, *, secret: str | bytes | None) -> str:
        value = self.password if not self.session_epoch else f"{self.password}:{self.session_epoch}"
        return salted_hmac("django.contrib.auth.models.AbstractBaseUser.get_session_auth_hash", value,
                           secret=secret, algorithm="sha256").hexdigest()


class Organization(models.Model):
    """A tenant: a school, or the personal account that self-registration creates."""

    class Kind(models.TextChoices):
        SCHOOL = "school"
        PERSONAL = "personal"

    public_id = models.CharField(max_length=32, unique=True, default=new_org_public_id, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SCHOOL)
    # Tier name: accounts.tiers maps it to limits; stacks (active stacks) and billing.entitlements
    # (storage) enforce them.
    tier = models.CharField(max_length=32, default="free")
    # The paid tier whose overflow is billed instead of refused (docs/kernle-protocol.md §12.6-12.7),
    # "" for hard limits. billing.services keeps it in step with the subscription (a paid tier with
    # overflow prices, active or running out a cancelled period), beside `tier`; it lives here so
    # that stacks, below billing, can honour it in the stack quota. It counts only while it names
    # `tier`, so a tier changed by any other hand falls back to hard limits (`overflow_billed`).
    overflow_tier = models.CharField(max_length=32, blank=True, default="")
    # Salience below which the decay pass tombstones a non-protected memory (per school).
    forget_threshold = models.FloatField(default=0.05)
    # School policy: may teachers issue, revoke and cycle keys for their assigned stacks? Off by
    # default; such keys act as the teacher and die with the teacher's assignment.
    teachers_may_manage_keys = models.BooleanField(default=False)
    # Retention per memory kind in days, e.g. {"raw": 365}: the TTL job purges memories created
    # longer ago (memories.lifecycle.ttl). A kind left out is kept until expiry or erasure. New
    # schools start with a limit for every kind (default_retention_days); schools created before
    # keep what they had. Validated by memories.lifecycle.ttl.retention_validated.
    retention_days = models.JSONField(default=default_retention_days, blank=True)
    # When an admin last saved the retention (even unchanged): a kind left without a limit is then a
    # deliberate choice, and the overview stops asking the school to review it.
    retention_reviewed_at = models.DateTimeField(null=True, blank=True)
    # The PII categories this school redacts at ingest (memories.privacy.redaction names them; secrets are
    # always redacted whatever this says). None: every PII category (the default).
    redaction_categories = models.JSONField(null=True, blank=True, default=None)
    # What an empty `access_grants` list means for school staff and school keys (docs/privacy.md
    # "Privacy grants"): "school" — staff of the school may read it; "owner" — only the stack's own keys.
    class EmptyGrantsPolicy(models.TextChoices):
        SCHOOL = "school"
        OWNER = "owner"

    empty_grants_policy = models.CharField(max_length=8, choices=EmptyGrantsPolicy.choices,
                                           default=EmptyGrantsPolicy.SCHOOL)
    # Opt-in: keep raw entries' original (unredacted) text, encrypted at rest (AES-256-GCM with the
    # keys in MEMORYHUB_ENCRYPTION_KEYS). Off: only the redacted text is ever stored.
    keep_raw_originals = models.BooleanField(default=False)
    # How long the access log (who was served which memories, memories.MemoryAccess) is kept; the
    # TTL job purges older rows (docs/privacy.md "Access log").
    access_log_retention_days = models.PositiveIntegerField(default=365)
    # Opt-in: a school-wide key's first kernle push to an unknown student id creates that student's
    # stack, within the plan's limits (docs/kernle-protocol.md §3.4). Off: such a push is a 404
    # naming this setting.
    provision_stacks_on_push = models.BooleanField(default=False)
    # Families (docs/guardians.md). Consent: agents may write to a student's stack only once a
    # guardian consented online or an admin recorded paper consent (stacks.StackConsent).
    consent_required = models.BooleanField(default=False)
    consent_text = models.TextField(blank=True, default="")  # what a guardian agrees to; empty: the default text

    class ConsentWithdrawal(models.TextChoices):
        KEEP = "keep"  # writes stop; what is stored stays, under the retention policy
        ERASE = "erase"  # writes stop and the stack is erased, with a certificate

    consent_withdrawal = models.CharField(max_length=8, choices=ConsentWithdrawal.choices,
                                          default=ConsentWithdrawal.KEEP)
    guardians_may_pause = models.BooleanField(default=True)

    class GuardianView(models.TextChoices):
        AGENT = "agent"  # everything the student's own agent sees
        GRANTED = "granted"  # only memories whose grants admit role:guardian

    guardian_view = models.CharField(max_length=8, choices=GuardianView.choices, default=GuardianView.AGENT)
    guardian_request_days = models.PositiveSmallIntegerField(default=10)  # a guardian request's due date, in days
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"

    @property
    def overflow_billed(self) -> bool:
        """Is growth past the tier's limits (stacks, storage) billed rather than refused?"""
        return bool(self.overflow_tier) and self.overflow_tier == self.tier


class Membership(models.Model):
    """A user's role in an organization. Teachers see only the stacks assigned to them."""

    class Role(models.TextChoices):
        ADMIN = "admin"
        TEACHER = "teacher"
        BILLING = "billing"
        # A parent or guardian: sees only the students linked to them (stacks.GuardianLink;
        # docs/guardians.md).
        GUARDIAN = "guardian"

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    # A guardian opted in to the weekly digest of their children's memories (docs/guardians.md "Weekly digest").
    weekly_digest = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="accounts_membership_unique")]


class ApiKey(models.Model):
    """An API key. The secret is shown once; we keep a keyed hash (HMAC-SHA256 with a pepper).

    Bound to one stack (an agent's key) or, with `stack` null, to the whole organization (a
    school's service key, which names the stack per request). `user` is whom the key acts as.

    What a stack-bound key may read of its stack's memories (docs/privacy.md "Keys and the grants"):
    with `stack_agent` it is the stack's own agent key and reads all of it, like the student's own
    agent (set only by an explicit, audited choice when it is issued); without it, it reads what its
    issuer may read — the school key `issued_by_key` names, else the person `user`.
    """

    public_id = models.CharField(max_length=40, unique=True, default=new_key_public_id, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_keys")
    stack = models.ForeignKey("stacks.Stack", null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    key_prefix = models.CharField(max_length=16, db_index=True)  # first 12 characters, for lookup and display
    key_hash = models.CharField(max_length=64)  # hex HMAC-SHA256(pepper, key)
    read_only = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    replaced_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The stack's own agent key: reads every memory of its stack whatever its grants say. Only with
    # a stack, only by the issuer's explicit choice (audited as `key.issued_as_stack_agent`).
    stack_agent = models.BooleanField(default=False)
    # The public id of the school-wide key that issued this key ("" when a person did): a key issued
    # by a school key reads what that school key may read. A public id, not a foreign key, so the
    # audience never changes (nor widens to `user`'s) if that key's row is ever deleted.
    issued_by_key = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(stack_agent=False) | models.Q(stack__isnull=False),
                                   name="accounts_apikey_stack_agent_has_stack"),
        ]


class AuditEvent(models.Model):
    """Security-relevant actions, viewable by school admins. Never holds secrets or memory text."""

    organization = models.ForeignKey(Organization, null=True, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=64)  # e.g. key.issued, key.cycled, stack.archived, login.succeeded
    target_type = models.CharField(max_length=32, blank=True, default="")
    target_id = models.CharField(max_length=128, blank=True, default="")
    ip = models.GenericIPAddressField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "-created_at"], name="accounts_audit_org_time")]


class Invitation(models.Model):
    """An admin's invitation for a person to join a school with a role (dashboard People page).

    The link carries a random token; only its SHA-256 is stored, so the database never holds a
    usable link. One pending invitation per email per school; it expires after a week
    (accounts/invitations.py)."""

    public_id = models.CharField(max_length=40, unique=True, default=new_invitation_public_id, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Membership.Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)  # hex SHA-256 of the link's token
    invited_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A guardian's invitation names the students it links them to once accepted.
    guardian_of = models.ManyToManyField("stacks.Stack", blank=True, related_name="+")
    # The invitee's name as the admin typed it (optional): a new account starts with it.
    name = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                "organization", Lower("email"),
                name="accounts_invitation_one_pending",
                condition=models.Q(accepted_at__isnull=True, revoked_at__isnull=True),
            )
        ]
