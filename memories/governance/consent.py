"""A student's consent and pause: the services every entry point calls (docs/consent.md).

* `consent_give` / `consent_withdraw` record a step of the stack's consent history
  (`stacks.StackConsent`; the latest row is the state, mirrored in `Stack.consent_given_at`, which the
  write kernel's gate reads: memories.writes.gate). Paper consent (method "paper") is recorded by a
  school admin; online consent (method "online") is given by a guardian linked to the student.
  A withdrawal under the school's `consent_withdrawal = "erase"` then erases the whole stack with a
  certificate (memories.governance.erasure.stack_erase_request); under "keep" the data stays.
* `memory_pause` / `memory_resume` stop and restart agents' writes (`Stack.paused_at`): a school
  admin, or a linked guardian when the school lets guardians pause (`guardians_may_pause`).
* `consent_state` is what the API and the pages show: required?, in force?, paused?, the history.

Every caller resolved the stack through stacks.selectors (a stack it cannot see is a 404), so a
guardian reaches only their linked children. Who may do which step is decided here (403
`admin_required` / `guardian_required` / `guardian_pause_off`), so the API and the dashboard
cannot differ. Every step is one transaction under the stack's row lock (pushes hold the same lock,
so a push committed after a pause sees it) and one audit event (never the note's or memory text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from accounts.models import Membership, Organization, User
from accounts.principal import Principal
from accounts.services import audit_record
from memories.governance.erasure import stack_erase_request
from memories.models import ErasureCertificate
from memoryhub.errors import Conflict, Forbidden, InvalidInput
from stacks.models import Stack, StackConsent

NOTE_MAX = 500
# What a guardian agrees to when the school wrote nothing of its own (Organization.consent_text).
DEFAULT_CONSENT_TEXT = (
    "I agree that my child's AI tutor may keep a private memory of their learning at this school: what "
    "they worked on, what helped and what they found hard, so that the tutor can pick up where they left "
    "off. The school and its staff can see this memory; it is never sold or used to train models. I can "
    "pause the memory or withdraw this consent at any time, and I can ask the school to erase it."
)


def consent_text_of(organization: Organization) -> str:
    """The consent text a guardian reads: the school's own, or the default."""
    return organization.consent_text.strip() or DEFAULT_CONSENT_TEXT


@dataclass(frozen=True)
class ConsentStep:
    action: str
    method: str
    by: str  # a member of staff's name or e-mail, or "guardian <name>"; "" when the person was removed
    at: datetime
    note: str


@dataclass(frozen=True)
class ConsentState:
    required: bool
    in_force: bool
    given_at: datetime | None
    paused: bool
    paused_at: datetime | None
    paused_by: str
    writes_allowed: bool
    text: str
    history: list[ConsentStep] = field(default_factory=list)  # newest first


def person_label(user: User | None, *, guardian: bool = False) -> str:
    if user is None:
        return ""
    name = user.get_full_name().strip() or user.email or user.get_username()
    return f"guardian {name}" if guardian else name


def consent_state(stack: Stack) -> ConsentState:
    """The stack's consent and pause as shown (reads; the history newest first)."""
    organization = stack.organization
    rows = StackConsent.objects.filter(stack_id=stack.pk).select_related("by_user").order_by("-created_at", "-id")
    history = [ConsentStep(action=row.action, method=row.method, at=row.created_at, note=row.note,
                           by=person_label(row.by_user, guardian=row.method == StackConsent.Method.ONLINE))
               for row in rows]
    in_force = stack.consent_given_at is not None
    paused_by = ""
    if stack.paused_at is not None and stack.paused_by_id is not None:
        # Named as the history names people: "guardian <name>" when a guardian of the school paused it.
        by_guardian = Membership.objects.filter(user_id=stack.paused_by_id, organization_id=organization.pk,
                                                role=Membership.Role.GUARDIAN).exists()
        paused_by = person_label(stack.paused_by, guardian=by_guardian)
    return ConsentState(
        required=organization.consent_required, in_force=in_force, given_at=stack.consent_given_at,
        paused=stack.paused_at is not None, paused_at=stack.paused_at, paused_by=paused_by,
        writes_allowed=(in_force or not organization.consent_required) and stack.paused_at is None,
        text=consent_text_of(organization), history=history)


# --- who may --------------------------------------------------------------------------------------

def is_school_admin(principal: Principal) -> bool:
    """A school admin, signed in or through a writable school key (the school's own systems, e.g. a
    student information system recording paper forms); never a student's agent key or a teacher."""
    return principal.is_org_wide and not principal.read_only


def is_guardian(principal: Principal) -> bool:
    """A signed-in guardian (the stack was resolved through the selectors: it is linked to them)."""
    return principal.api_key is None and principal.role == Membership.Role.GUARDIAN


def ensure_may_record_consent(principal: Principal, method: str) -> None:
    if method == StackConsent.Method.PAPER and not is_school_admin(principal):
        raise Forbidden("Only a school admin may record paper consent.", code="admin_required")
    if method == StackConsent.Method.ONLINE and not is_guardian(principal):
        raise Forbidden("Online consent is given by the student's guardian.", code="guardian_required")


def ensure_may_pause(principal: Principal, stack: Stack) -> None:
    if is_school_admin(principal):
        return
    if is_guardian(principal):
        if not stack.organization.guardians_may_pause:
            raise Forbidden("This school does not let guardians pause the memory; ask the school.",
                            code="guardian_pause_off")
        return
    raise Forbidden("Only a school admin or the student's guardian may pause or resume the memory.",
                    code="admin_required")


def ensure_may_read_consent(principal: Principal) -> None:
    """Staff and guardians who see the stack, and school keys; a student's own agent key learns why it
    is refused from the refusal's code, not whose consent it is (the history names people)."""
    if principal.is_stack_bound:
        raise Forbidden("An agent key cannot read the consent history.", code="forbidden")


def _note(note: str) -> str:
    text = (note or "").strip()
    if len(text) > NOTE_MAX or "\x00" in text:
        raise InvalidInput("The note is too long.", fields={"note": [f"At most {NOTE_MAX} characters."]})
    return text


def _method(method: str) -> str:
    if method not in StackConsent.Method.values:
        raise InvalidInput("Unknown consent method.", fields={"method": ["One of: online, paper."]})
    return method


# --- consent --------------------------------------------------------------------------------------

def consent_give(stack: Stack, *, by: Principal, method: str, ip: str | None = None, session_ref: str = "",
                 note: str = "") -> ConsentState:
    """Record consent given (paper by a school admin, online by a linked guardian): agents may write
    from its commit on. Giving it again while in force is refused (409 `consent_already_given`)."""
    method = _method(method)
    ensure_may_record_consent(by, method)
    note = _note(note)
    with transaction.atomic():
        locked = _locked(stack)
        if locked.consent_given_at is not None:
            raise Conflict("Consent is already in force.", code="consent_already_given")
        text = consent_text_of(locked.organization)
        row = StackConsent.objects.create(stack=locked, action=StackConsent.Action.GIVEN, method=method,
                                          by_user=by.user, text=text, session_ref=session_ref[:64], ip=ip,
                                          note=note)
        locked.consent_given_at = row.created_at
        locked.save(update_fields=["consent_given_at", "updated_at"])
        audit_record(organization=locked.organization, action="consent.given", principal=by,
                     target_type="stack", target_id=str(locked.pk), ip=ip,
                     metadata={"stack": locked.slug, "method": method})
    return consent_state(locked)


def consent_withdraw(stack: Stack, *, by: Principal, method: str, ip: str | None = None, session_ref: str = "",
                     note: str = "") -> tuple[ConsentState, ErasureCertificate | None]:
    """Record consent withdrawn: agents' writes are refused from its commit on. Under the school's
    `consent_withdrawal = "erase"` the stack is then erased with a certificate (returned; the stack is
    archived by the erasure); under "keep" what is stored stays. Withdrawing what is not in force is
    refused (409 `consent_not_given`)."""
    method = _method(method)
    ensure_may_record_consent(by, method)
    note = _note(note)
    with transaction.atomic():
        locked = _locked(stack)
        if locked.consent_given_at is None:
            raise Conflict("No consent is in force.", code="consent_not_given")
        StackConsent.objects.create(stack=locked, action=StackConsent.Action.WITHDRAWN, method=method,
                                    by_user=by.user, session_ref=session_ref[:64], ip=ip, note=note)
        locked.consent_given_at = None
        locked.save(update_fields=["consent_given_at", "updated_at"])
        erase = locked.organization.consent_withdrawal == Organization.ConsentWithdrawal.ERASE
        audit_record(organization=locked.organization, action="consent.withdrawn", principal=by,
                     target_type="stack", target_id=str(locked.pk), ip=ip,
                     metadata={"stack": locked.slug, "method": method, "erase": erase})
    certificate = None
    if erase:
        who = person_label(by.user, guardian=method == StackConsent.Method.ONLINE)
        certificate = stack_erase_request(principal=by, stack=locked, confirm=locked.slug, ip=ip,
                                          requested_by=f"consent withdrawn by {who}"[:1000])
        locked.refresh_from_db()
    return consent_state(locked), certificate


# --- pause ----------------------------------------------------------------------------------------

def memory_pause(stack: Stack, *, by: Principal, ip: str | None = None) -> ConsentState:
    """Pause the student's memory: agents' writes are refused (403 / per-operation `memory_paused`),
    reads go on. Pausing a paused stack changes nothing."""
    ensure_may_pause(by, stack)
    with transaction.atomic():
        locked = _locked(stack)
        if locked.paused_at is None:
            locked.paused_at = timezone.now()
            locked.paused_by = by.user
            locked.save(update_fields=["paused_at", "paused_by", "updated_at"])
            audit_record(organization=locked.organization, action="stack.memory_paused", principal=by,
                         target_type="stack", target_id=str(locked.pk), ip=ip,
                         metadata={"stack": locked.slug, "by_guardian": is_guardian(by)})
    return consent_state(locked)


def memory_resume(stack: Stack, *, by: Principal, ip: str | None = None) -> ConsentState:
    """Resume the student's memory (writes allowed again, consent permitting). Resuming a stack that
    is not paused changes nothing."""
    ensure_may_pause(by, stack)
    with transaction.atomic():
        locked = _locked(stack)
        if locked.paused_at is not None:
            locked.paused_at = None
            locked.paused_by = None
            locked.save(update_fields=["paused_at", "paused_by", "updated_at"])
            audit_record(organization=locked.organization, action="stack.memory_resumed", principal=by,
                         target_type="stack", target_id=str(locked.pk), ip=ip,
                         metadata={"stack": locked.slug, "by_guardian": is_guardian(by)})
    return consent_state(locked)


def _locked(stack: Stack) -> Stack:
    """The stack's row, re-read under its lock (the lock pushes take), with its school as the caller read it."""
    locked = Stack.objects.select_for_update(of=("self",)).select_related("paused_by").get(pk=stack.pk)
    locked.organization = stack.organization
    return locked
