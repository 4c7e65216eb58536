"""A guardian's requests about their child's memory: corrections and deletions with a due date
(docs/guardians.md "Requests").

* `request_create` — a guardian asks, for a child linked to them (the caller resolved the stack
  through stacks.selectors: another family's child is a 404), for a correction (one memory they may
  see and the text they believe is right) or a deletion (one memory, or the whole stack). It is due
  `Organization.guardian_request_days` days later.
* `request_approve` — a school admin approves: a correction becomes a revision written through the
  one write path (memories.services.memory_update, source "dashboard") whose reason and author name
  the request (`correction asked for in guardian request #<id>`; the author's agent label
  `guardian request #<id>`); a deletion runs the erasure service
  (memories.governance.erasure) for the memory or the whole stack, and the request keeps the
  certificate's id.
* `request_decline` — a school admin declines with a reason the guardian reads on their page.
* `requests_for_school` / `request_for_school` — the admins' queue (another school's request is a
  404); `requests_for_guardian` — what a guardian asked for one child.

Every step is one audit event (`guardian_request.created`, `.approved`, `.declined`; kind, scope,
stack — never the text) and e-mails the guardian (guardian_notices; no memory text in any e-mail);
a new request e-mails the school's admins as well. The proposed text is kept only while the request
is open: once decided it is in the memory's revision (approved) or no longer needed (declined).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.authors import Author, Path
from accounts.models import Membership
from accounts.principal import Principal
from accounts.selectors import ensure_may_manage_organization
from accounts.services import audit_record
from memories.governance import guardian_notices as notices
from memories.governance.consent import is_guardian, person_label
from memories.governance.erasure import memory_erase_request, stack_erase_request
from memories.models import ErasureCertificate, Memory, MemoryKind
from memories.privacy.grants import audience_for
from memories.selectors import memory_get
from memories.services import memory_update
from memoryhub.errors import Conflict, Forbidden, InvalidInput, NotFound
from stacks.models import GuardianRequest, Stack

TEXT_MAX = 20_000
REASON_MAX = 1000
DUE_SOON = timedelta(days=2)  # an open request due within this (or overdue) needs attention
REQUEST_SOURCE = "dashboard"  # the writer named in the correction's revision (the school's own work)
# The field a correction rewrites, per kind: the memory's main text.
CORRECTABLE: dict[str, str] = {MemoryKind.RAW: "content", MemoryKind.EPISODE: "objective", MemoryKind.NOTE: "content",
               MemoryKind.BELIEF: "statement", MemoryKind.VALUE: "statement", MemoryKind.GOAL: "title",
               MemoryKind.PLAYBOOK: "description"}


def request_label(request: GuardianRequest) -> str:
    """How revisions, certificates and e-mails name the request."""
    return f"guardian request #{request.pk}"


@dataclass(frozen=True)
class RequestView:
    """A request as the pages show it: the row, the child's name and how long until it is due."""

    request: GuardianRequest
    requested_by: str
    decided_by: str

    @property
    def overdue(self) -> bool:
        return self.request.status == GuardianRequest.Status.OPEN and self.request.due_at <= timezone.now()

    @property
    def due_soon(self) -> bool:
        return (self.request.status == GuardianRequest.Status.OPEN
                and self.request.due_at <= timezone.now() + DUE_SOON)


def _view(row: GuardianRequest) -> RequestView:
    return RequestView(request=row, requested_by=person_label(row.requested_by, guardian=True),
                       decided_by=person_label(row.decided_by))


# --- the guardian's side --------------------------------------------------------------------------

def _clean_text(raw: Any, *, field: str, maximum: int, message: str) -> str:
    text = raw.strip() if isinstance(raw, str) else ""
    if not text or len(text) > maximum or "\x00" in text:
        raise InvalidInput(message, fields={field: [f"Required, at most {maximum:,} characters."]})
    return text


def request_create(*, principal: Principal, stack: Stack, kind: Any, memory_id: Any = None, text: Any = "",
                   ip: str | None = None, site: str = "") -> GuardianRequest:
    """A guardian's request for their child (`stack`, resolved by the caller through the selectors).

    `kind` "correction" names a memory the guardian may see (`memory_id`; else 404) and the `text`
    they believe is right; "deletion" names a memory, or none for the whole stack. 400 on bad input,
    403 for anyone but a guardian, 409 when the same request is already open or the stack is erased."""
    if not is_guardian(principal):
        raise Forbidden("Requests are made by the student's guardian.", code="guardian_required")
    if kind not in GuardianRequest.Kind.values:
        raise InvalidInput("Choose a correction or a deletion.", fields={"kind": ["correction or deletion"]})
    memory: Memory | None = None
    if memory_id not in (None, ""):
        memory = memory_get(stack=stack, memory_id=str(memory_id), audience=audience_for(principal, stack_id=stack.pk))
    proposed = ""
    if kind == GuardianRequest.Kind.CORRECTION:
        if memory is None:
            raise InvalidInput("Say which memory to correct.", fields={"memory_id": ["Required for a correction."]})
        if memory.kind not in CORRECTABLE:
            raise InvalidInput("This kind of memory cannot be corrected by text; ask for its deletion instead.",
                               fields={"kind": ["Not correctable."]})
        proposed = _clean_text(text, field="text", maximum=TEXT_MAX, message="Write the text you believe is right.")
    scope = GuardianRequest.Scope.MEMORY if memory is not None else GuardianRequest.Scope.STACK
    with transaction.atomic():
        locked = Stack.objects.select_for_update(of=("self",)).get(pk=stack.pk)
        duplicate = GuardianRequest.objects.filter(stack_id=locked.pk, kind=kind, scope=scope,
                                                   memory_ref=memory.pk if memory else None,
                                                   status=GuardianRequest.Status.OPEN).exists()
        if duplicate:
            raise Conflict("You already asked for this; the school has not answered yet.", code="request_open")
        organization = principal.organization
        row = GuardianRequest.objects.create(
            organization=organization, stack=locked, kind=kind, scope=scope,
            memory_ref=memory.pk if memory else None, text=proposed, requested_by=principal.user,
            due_at=timezone.now() + timedelta(days=organization.guardian_request_days))
        audit_record(organization=organization, action="guardian_request.created", principal=principal,
                     target_type="guardian_request", target_id=str(row.pk), ip=ip,
                     metadata={"stack": locked.slug, "kind": kind, "scope": scope})
        row.stack = locked
        locked.organization = organization
        transaction.on_commit(lambda: notices.request_created(row, admins=_admin_emails(organization.pk), site=site))
    return row


def requests_for_guardian(principal: Principal, stack: Stack) -> list[RequestView]:
    """What this guardian asked for this child (newest first); other guardians' requests stay theirs."""
    rows = (GuardianRequest.objects.filter(stack_id=stack.pk, requested_by_id=principal.user.pk)
            .select_related("requested_by", "decided_by").order_by("-requested_at", "-id"))
    return [_view(row) for row in rows]


def request_of_guardian(principal: Principal, stack: Stack, request_id: Any) -> GuardianRequest:
    """One of this guardian's requests for this child (404 otherwise)."""
    try:
        pk = int(request_id)
    except (TypeError, ValueError):
        raise NotFound("Request not found.", code="request_not_found") from None
    row = GuardianRequest.objects.filter(pk=pk, stack_id=stack.pk, requested_by_id=principal.user.pk).first()
    if row is None:
        raise NotFound("Request not found.", code="request_not_found")
    return row


def request_certificate(row: GuardianRequest) -> ErasureCertificate:
    """The erasure certificate of an approved deletion (404 before there is one)."""
    cert = (ErasureCertificate.objects.select_related("organization")
            .filter(pk=row.certificate_ref, organization_id=row.organization_id).first()
            if row.certificate_ref else None)
    if cert is None:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found")
    return cert


# --- the school's side ----------------------------------------------------------------------------

def requests_for_school(principal: Principal, *, status: str | None = GuardianRequest.Status.OPEN) -> list[RequestView]:
    """The school's requests for its admins (403 for anyone else): open ones by due date first."""
    ensure_may_manage_organization(principal)
    rows = (GuardianRequest.objects.filter(organization_id=principal.organization.pk)
            .select_related("stack", "requested_by", "decided_by"))
    rows = rows.filter(status=status).order_by("due_at", "id") if status else rows.order_by("-requested_at", "-id")
    return [_view(row) for row in rows[:200]]


def requests_due_soon(principal: Principal, *, now: datetime | None = None) -> QuerySet[GuardianRequest]:
    """The school's open requests due within DUE_SOON or overdue (the overview's "needs attention")."""
    moment = now or timezone.now()
    return (GuardianRequest.objects.filter(organization_id=principal.organization.pk,
                                           status=GuardianRequest.Status.OPEN, due_at__lte=moment + DUE_SOON)
            .select_related("stack").order_by("due_at", "id"))


def request_for_school(principal: Principal, request_id: Any) -> RequestView:
    """One request of the caller's school, for its admins; another school's (or none) is a 404."""
    try:
        pk = int(request_id)
    except (TypeError, ValueError):
        raise NotFound("Request not found.", code="request_not_found") from None
    if not principal.is_org_wide or principal.read_only:
        raise NotFound("Request not found.", code="request_not_found")
    row = (GuardianRequest.objects.select_related("stack", "requested_by", "decided_by")
           .filter(pk=pk, organization_id=principal.organization.pk).first())
    if row is None:
        raise NotFound("Request not found.", code="request_not_found")
    row.stack.organization = principal.organization
    return _view(row)


def request_memory(row: GuardianRequest) -> Memory | None:
    """The memory a request names, if it is still stored (the admin reads it before deciding)."""
    if row.memory_ref is None:
        return None
    return Memory.objects.filter(pk=row.memory_ref, stack_id=row.stack_id, deleted_at__isnull=True).first()


def _locked_open(row: GuardianRequest) -> GuardianRequest:
    locked = GuardianRequest.objects.select_for_update().get(pk=row.pk)
    if locked.status != GuardianRequest.Status.OPEN:
        raise Conflict("This request was decided already.", code="request_decided")
    locked.stack = row.stack
    return locked


def request_approve(*, principal: Principal, row: GuardianRequest, ip: str | None = None,
                    site: str = "") -> GuardianRequest:
    """Approve an open request (school admins): the correction is written, the deletion erased, in
    one transaction with the decision (a failure leaves the request open and nothing changed).
    409 when it was decided already, or when the memory it names is gone."""
    ensure_may_manage_organization(principal)
    stack = row.stack
    with transaction.atomic():
        locked = _locked_open(row)
        memory = request_memory(locked)
        if locked.scope == GuardianRequest.Scope.MEMORY and memory is None:
            raise Conflict("The memory this request names is no longer stored; decline it saying so.",
                           code="memory_gone")
        label = request_label(locked)
        if memory is not None:
            memory.stack = stack
        if locked.kind == GuardianRequest.Kind.CORRECTION and memory is not None:
            author = Author(path=Path.DASHBOARD, user_id=principal.user.pk, user=principal.user.email, agent=label)
            memory_update(memory=memory, payload={CORRECTABLE[memory.kind]: locked.text}, source=REQUEST_SOURCE,
                          author=author, reason=f"correction asked for in {label}")
        elif locked.kind == GuardianRequest.Kind.DELETION:
            requested_by = f"{label} from {person_label(locked.requested_by, guardian=True)}"[:1000]
            certificate = (memory_erase_request(principal=principal, memory=memory, requested_by=requested_by, ip=ip)
                           if memory is not None else
                           stack_erase_request(principal=principal, stack=stack, requested_by=requested_by,
                                               confirm=stack.slug, ip=ip))
            locked.certificate_ref = certificate.pk
        locked.status = GuardianRequest.Status.APPROVED
        locked.decided_by = principal.user
        locked.decided_at = timezone.now()
        locked.text = ""
        locked.save(update_fields=["status", "decided_by", "decided_at", "text", "certificate_ref"])
        audit_record(organization=stack.organization, action="guardian_request.approved", principal=principal,
                     target_type="guardian_request", target_id=str(locked.pk), ip=ip,
                     metadata={"stack": stack.slug, "kind": locked.kind, "scope": locked.scope})
        if locked.kind == GuardianRequest.Kind.DELETION:
            # Nothing asked about what was erased can still be done: its other open requests are closed.
            _close_erased(locked, principal)
        transaction.on_commit(lambda: notices.request_approved(locked, site=site))
    return locked


def _close_erased(row: GuardianRequest, principal: Principal) -> None:
    others = GuardianRequest.objects.filter(stack_id=row.stack_id, status=GuardianRequest.Status.OPEN)
    if row.scope == GuardianRequest.Scope.MEMORY:
        others = others.filter(memory_ref=row.memory_ref)
    others.update(status=GuardianRequest.Status.DECLINED, decided_by=principal.user, decided_at=timezone.now(),
                  text="", reason=f"What it asks about was erased at {request_label(row)}.")


def request_decline(*, principal: Principal, row: GuardianRequest, reason: Any, ip: str | None = None,
                    site: str = "") -> GuardianRequest:
    """Decline an open request with a reason the guardian reads (school admins; 400 without one)."""
    ensure_may_manage_organization(principal)
    text = _clean_text(reason, field="reason", maximum=REASON_MAX,
                       message="Say why the request is declined: the guardian reads it.")
    with transaction.atomic():
        locked = _locked_open(row)
        locked.status = GuardianRequest.Status.DECLINED
        locked.decided_by = principal.user
        locked.decided_at = timezone.now()
        locked.reason = text
        locked.text = ""
        locked.save(update_fields=["status", "decided_by", "decided_at", "reason", "text"])
        audit_record(organization=row.stack.organization, action="guardian_request.declined", principal=principal,
                     target_type="guardian_request", target_id=str(locked.pk), ip=ip,
                     metadata={"stack": row.stack.slug, "kind": locked.kind, "scope": locked.scope})
        transaction.on_commit(lambda: notices.request_declined(locked, site=site))
    return locked


def _admin_emails(organization_id: int) -> list[str]:
    return [email for email in Membership.objects.filter(
        organization_id=organization_id, role=Membership.Role.ADMIN, user__is_active=True)
        .values_list("user__email", flat=True) if email]


def requests_erase_for_memory(stack_id: int, memory_id: Any) -> dict[str, int]:
    """The memory erasure's eraser (memories.governance.erasure.register_memory_eraser): a correction
    proposed for the erased memory is its text too; the request itself stays, as for a stack."""
    cleared = (GuardianRequest.objects.filter(stack_id=stack_id, memory_ref=memory_id).exclude(text="")
               .update(text=""))
    return {"guardian_request_texts": cleared}


def requests_erase_for_stack(stack_id: int) -> dict[str, int]:
    """The stack erasure's eraser (memories.governance.erasure.register_stack_eraser): the corrections
    guardians proposed for the erased student are memory text too, so they go; the requests stay (the
    school's record that they were made, and how they were answered)."""
    cleared = GuardianRequest.objects.filter(stack_id=stack_id).exclude(text="").update(text="")
    return {"guardian_request_texts": cleared}
