"""Organizations (schools or personal accounts), people, roles, API keys and the audit log."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models.functions import Lower


def new_user_public_id() -> str:
    return f"usr_{secrets.token_hex(6)}"


def new_org_public_id() -> str:
    return f"org_{secrets.token_hex(6)}"


def new_key_public_id() -> str:
    return f"key_{secrets.token_hex(8)}"


class User(AbstractUser):
    """A person (school staff) or an agent builder. `public_id` is what the API and JWTs show."""

    public_id = models.CharField(max_length=32, unique=True, default=new_user_public_id, editable=False)
    email = models.EmailField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                Lower("email"),
                name="accounts_user_email_ci_unique",
                condition=~models.Q(email=""),
            )
        ]


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
    # Salience below which the decay pass tombstones a non-protected memory (per school).
    forget_threshold = models.FloatField(default=0.05)
    # School policy: may teachers issue, revoke and cycle keys for their assigned stacks? Off by
    # default; such keys act as the teacher and die with the teacher's assignment.
    teachers_may_manage_keys = models.BooleanField(default=False)
    # Retention per memory kind in days, e.g. {"raw": 365}: the TTL job purges memories created
    # longer ago (memories.lifecycle.ttl). Empty (the default): keep until expiry or erasure.
    # Validated by memories.lifecycle.ttl.retention_validated (kinds are the memories app's).
    retention_days = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"


class Membership(models.Model):
    """A user's role in an organization. Teachers see only the stacks assigned to them."""

    class Role(models.TextChoices):
        ADMIN = "admin"
        TEACHER = "teacher"
        BILLING = "billing"

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="accounts_membership_unique")]


class ApiKey(models.Model):
    """An API key. The secret is shown once; we keep a keyed hash (HMAC-SHA256 with a pepper).

    Bound to one stack (an agent's key) or, with `stack` null, to the whole organization (a
    school's service key, which names the stack per request). `user` is whom the key acts as.
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
    created_at = models.DateTimeField(auto_now_add=True)


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
