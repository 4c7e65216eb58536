"""Stacks: one private memory per student or agent, owned by one organization."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Stack(models.Model):
    class Kind(models.TextChoices):
        STUDENT = "student"
        AGENT = "agent"

    class Status(models.TextChoices):
        ACTIVE = "active"
        ARCHIVED = "archived"

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="stacks")
    # The stable id clients use (e.g. "student-4521"), unique within the organization. Kernle's
    # alphabet: 1-100 chars of letters, digits, '-', '_' and '.'.
    slug = models.CharField(max_length=100)
    display_name = models.CharField(max_length=200, blank=True, default="")
    # The student's grade or year as the school's roster writes it ("5", "K", "09"); free text.
    grade = models.CharField(max_length=32, blank=True, default="")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.STUDENT)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Usage counters, maintained with F() expressions after commit of each write.
    memory_count = models.BigIntegerField(default=0)
    bytes_used = models.BigIntegerField(default=0)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    # When a memory was last created or its content changed (not forget/recover/protect, not the
    # jobs' tombstones): set by the write kernel in the same counters UPDATE (memories.writes.rows).
    last_write_at = models.DateTimeField(null=True, blank=True)
    # Set (never cleared) by the first erasure in the stack (memories.governance.erasure), in the erasure's
    # transaction under the stack row lock: until then the sync engine skips the tombstone lookup a
    # push would otherwise make per batch (memories.sync.engine), read from the row it locked anyway.
    has_erasures = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    # Consent in force (docs/guardians.md "Consent"): when the latest StackConsent gave it; None when
    # none was given or it was withdrawn. Read by the write path when the school requires consent.
    consent_given_at = models.DateTimeField(null=True, blank=True)
    # Paused by a guardian (or an admin): agents' writes are refused, reads go on.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "slug"], name="stacks_stack_org_slug_unique")]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_archived(self) -> bool:
        return self.status == self.Status.ARCHIVED


class TeacherAssignment(models.Model):
    """A teacher may see and manage exactly the stacks assigned to them."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stack_assignments")
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="teacher_assignments")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "stack"], name="stacks_assignment_unique")]


class GuardianLink(models.Model):
    """A guardian (Membership role "guardian") may see exactly the students linked to them."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="guardian_links")
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="guardian_links")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "stack"], name="stacks_guardian_link_unique")]


class StackConsent(models.Model):
    """One step of a student's consent history: given or withdrawn, by whom, how and when.
    The latest row is the state in force (mirrored in Stack.consent_given_at)."""

    class Action(models.TextChoices):
        GIVEN = "given"
        WITHDRAWN = "withdrawn"

    class Method(models.TextChoices):
        ONLINE = "online"  # a guardian, signed in
        PAPER = "paper"  # recorded by a school admin (dashboard or API)

    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="consents")
    action = models.CharField(max_length=16, choices=Action.choices)
    method = models.CharField(max_length=16, choices=Method.choices)
    by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    text = models.TextField(blank=True, default="")  # the consent text as shown when given
    session_ref = models.CharField(max_length=64, blank=True, default="")  # hash of the sign-in session, not the key
    ip = models.GenericIPAddressField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True, default="")  # e.g. where the paper form is kept
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class GuardianRequest(models.Model):
    """A guardian's request about their child's memory: a correction (one memory and the text the
    guardian believes is right) or a deletion (one memory, or the whole stack), due by `due_at`
    (docs/guardians.md "Requests"). The memory and the erasure certificate are named by id only:
    an erasure deletes memory rows outside the ORM, and the certificate outlives everything."""

    class Kind(models.TextChoices):
        CORRECTION = "correction"
        DELETION = "deletion"

    class Scope(models.TextChoices):
        MEMORY = "memory"
        STACK = "stack"

    class Status(models.TextChoices):
        OPEN = "open"
        APPROVED = "approved"
        DECLINED = "declined"

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="guardian_requests")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    memory_ref = models.UUIDField(null=True, blank=True)
    # A correction's proposed text while the request is open; cleared once it is decided.
    text = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    requested_at = models.DateTimeField(auto_now_add=True)
    due_at = models.DateTimeField()
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")  # why it was declined, for the guardian
    certificate_ref = models.UUIDField(null=True, blank=True)  # an approved deletion's erasure certificate

    class Meta:
        indexes = [models.Index(fields=["organization", "status", "due_at"], name="stacks_request_queue")]
