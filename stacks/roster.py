"""A school's roster: reading a roster CSV, planning what importing it would change, applying it.

Two formats, told apart by their header row:

* the plain `student_id,name,grade,teacher_email` CSV (`grade` and `teacher_email` optional;
  several teachers in one cell separated by ';');
* OneRoster 1.1 `users.csv` (sourcedId, status, role, givenName, familyName, identifier, grades,
  …): only rows with role=student become stacks; the stack id is the row's `identifier`, else its
  `sourcedId`, made to fit the stack-id alphabet. OneRoster links teachers to students through
  enrollments.csv, not users.csv, so this import assigns no teachers.

Both may name students' parents and guardians (the plain `guardian_email` column; OneRoster's
parent and guardian rows, linked by `agentSourcedIds`): they are invited or linked as guardians
(stacks/roster_guardians.py, docs/guardians.md).

Importing is two steps. `roster_plan` says per row what would happen — create, update (name,
grade or a new teacher), unchanged, skipped (with the reason) or an error (with the reason) — each
row numbered as a spreadsheet numbers it (the header is row 1). `roster_apply` plans again (the
school may have changed since the preview) and, only if no row has an error and the plan fits
the tier's stack quota, applies every row in one transaction through stacks.services, so each
change is audited as if made by hand, plus one `roster.imported` summary event. A file with any
bad row changes nothing, and importing the same file twice changes nothing the second time.

An import only adds: teachers assigned by hand and students missing from the file are left alone.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from django.db import transaction

from accounts.invitations import NewInvitation
from accounts.models import Membership, User
from accounts.principal import Principal
from accounts.selectors import ensure_may_manage_organization, members_visible_to
from accounts.services import audit_record
from memoryhub.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from stacks import roster_guardians
from stacks.models import Stack, TeacherAssignment
from stacks.selectors import plausible_identifier, stack_limit_message, stack_room, stacks_visible_to
from stacks.services import (
    STACK_ID_MAX_LENGTH,
    stack_create,
    stack_id_validated,
    stack_update,
    teacher_assign,
)

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_ROWS = 10_000
NAME_MAX_LENGTH = 200  # Stack.display_name
GRADE_MAX_LENGTH = 32  # Stack.grade

PLAIN_HEADER = ("student_id", "name", "grade", "teacher_email")
ONEROSTER_HEADER = ("sourcedId", "status", "dateLastModified", "enabledUser", "orgSourcedIds", "role", "username",
                    "userIds", "givenName", "familyName", "middleName", "identifier", "email", "sms", "phone",
                    "agentSourcedIds", "grades", "password")
_DELIMITERS = (",", ";", "\t")  # spreadsheets in some locales save CSV with ';'


class RosterFormat(StrEnum):
    PLAIN = "plain"
    ONEROSTER = "oneroster"

    @property
    def label(self) -> str:
        if self is RosterFormat.ONEROSTER:
            return "OneRoster 1.1 users.csv"
        return "plain CSV: student_id, name, grade, teacher_email (and guardian_email, optional)"


class Outcome(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    SKIP = "skip"
    ERROR = "error"


@dataclass(frozen=True)
class RosterRow:
    """One data row as read. `problem` or `skip` set when the row is refused or passed over
    before anything about the school is known."""

    row: int  # the spreadsheet's row number; the header is row 1
    student_id: str
    name: str = ""
    grade: str = ""
    teacher_emails: tuple[str, ...] = ()
    problem: str = ""
    skip: str = ""
    guardians: tuple[tuple[str, str], ...] = ()  # (email, name) of the student's parents and guardians
    # OneRoster: the row's sourcedId and agentSourcedIds; a parent/guardian row's own address.
    source_id: str = ""
    agent_ids: tuple[str, ...] = ()
    guardian_email: str = ""


@dataclass(frozen=True)
class ParsedRoster:
    format: RosterFormat
    rows: tuple[RosterRow, ...]


@dataclass
class PlannedRow:
    row: int
    student_id: str
    name: str
    grade: str
    teacher_emails: tuple[str, ...]
    outcome: Outcome
    details: list[str] = field(default_factory=list)
    # What applying does for this row (None: leave as it is).
    set_name: str | None = None
    set_grade: str | None = None
    assign: list[User] = field(default_factory=list)
    stack: Stack | None = None  # the existing stack of an update
    guardian_steps: list[roster_guardians.GuardianStep] = field(default_factory=list)


@dataclass
class RosterPlan:
    format: RosterFormat
    rows: list[PlannedRow]
    # Problems of the import as a whole (the stack quota), shown above the rows.
    problems: list[str] = field(default_factory=list)
    quota_exceeded: bool = False
    applied: bool = False
    invitations: list[NewInvitation] = field(default_factory=list)  # guardians invited by applying: to e-mail

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(row.outcome.value for row in self.rows)
        return {outcome.value: counted.get(outcome.value, 0) for outcome in Outcome}

    @property
    def guardian_invitations(self) -> int:
        """Invitations applying would create and e-mail (one per family, however many children)."""
        return sum(step.action == "invite" for row in self.rows for step in row.guardian_steps)

    @property
    def errors(self) -> list[PlannedRow]:
        return [row for row in self.rows if row.outcome is Outcome.ERROR]

    @property
    def ok(self) -> bool:
        """May this plan be applied? (No bad row, and within the quota.)"""
        return not self.problems and not self.errors

    @property
    def changes(self) -> int:
        return sum(1 for row in self.rows if row.outcome in (Outcome.CREATE, Outcome.UPDATE))


# --- reading a file ----------------------------------------------------------------------------


def roster_parsed(data: bytes) -> ParsedRoster:
    """The rows of a roster file; InvalidInput (400) or PayloadTooLarge (413) for a file that is no
    roster at all: empty, too large, binary, not UTF-8, not CSV, an unknown header, too many rows."""
    ensure_roster_size(len(data))
    text = _decoded(data)
    if not text.strip():
        raise InvalidInput("The file is empty.", code="roster_empty")
    header, delimiter, roster_format = _header(text)
    records = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows: list[RosterRow] = []
    try:
        next(records)  # the header, already read
        for number, cells in enumerate(records, start=2):
            if not any(cell.strip() for cell in cells):
                continue  # a blank line in the sheet, nothing to import
            if len(rows) >= MAX_ROWS:
                raise InvalidInput(f"The file has more than {MAX_ROWS:,} rows; split it into smaller files.",
                                   code="roster_too_many_rows")
            rows.append(_row(number, header, cells, roster_format))
    except csv.Error as error:
        raise InvalidInput(f"The file is not a valid CSV file (near row {records.line_num}: {error}).",
                           code="roster_not_csv") from None
    if not rows:
        raise InvalidInput("The file has a header but no student rows.", code="roster_empty")
    if roster_format is RosterFormat.ONEROSTER:
        rows = roster_guardians.link_oneroster_guardians(rows)
    return ParsedRoster(format=roster_format, rows=tuple(rows))


def ensure_roster_size(size: int) -> None:
    """PayloadTooLarge (413) for a file over the cap (checked on an upload's size before reading it)."""
    if size > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"The file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB; split it into "
                              "smaller files.", code="roster_too_large")


def _decoded(data: bytes) -> str:
    not_text = InvalidInput("The file is not a UTF-8 CSV file. In your spreadsheet, save it as “CSV UTF-8” "
                            "and upload that.", code="roster_not_text")
    if b"\x00" in data:  # binary, or UTF-16 ("Unicode text" from a spreadsheet)
        raise not_text
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_text from None


def _header(text: str) -> tuple[list[str], str, RosterFormat]:
    """The header's column names (lower-cased), the delimiter and the format it announces."""
    first_line = text.splitlines()[0]  # the header must be row 1: error rows are numbered from it
    for delimiter in _DELIMITERS:
        try:
            cells = next(csv.reader([first_line], delimiter=delimiter, strict=True))
        except csv.Error:
            continue
        names = [cell.strip().lower() for cell in cells]
        if "sourcedid" in names and "role" in names:
            return names, delimiter, RosterFormat.ONEROSTER
        if "student_id" in names and "name" in names:
            return names, delimiter, RosterFormat.PLAIN
    raise InvalidInput("The first row is not a roster header. Use the columns "
                       f"{','.join(PLAIN_HEADER)}, or upload a OneRoster 1.1 users.csv "
                       "(with sourcedId, role, givenName, familyName …).", code="roster_unknown_header")


def _row(number: int, header: list[str], cells: list[str], roster_format: RosterFormat) -> RosterRow:
    extra = [cell for cell in cells[len(header):] if cell.strip()]
    values = {name: (cells[index].strip() if index < len(cells) else "") for index, name in enumerate(header)}
    read = _oneroster_row if roster_format is RosterFormat.ONEROSTER else _plain_row
    row = read(number, values)
    if extra and not row.problem and not row.skip:
        return _with_problem(row, f"has {len(cells)} cells but the header has {len(header)} columns")
    return row


def _plain_row(number: int, values: dict[str, str]) -> RosterRow:
    emails = tuple(email.strip() for email in values.get("teacher_email", "").split(";") if email.strip())
    row = RosterRow(row=number, student_id=values.get("student_id", ""), name=values.get("name", ""),
                    grade=values.get("grade", ""), teacher_emails=emails,
                    guardians=roster_guardians.plain_guardians(values))
    try:
        stack_id_validated(row.student_id, field="student_id")
    except InvalidInput as error:
        return _with_problem(row, "student_id is missing" if not row.student_id else error.message)
    return _checked_lengths(row)


def _oneroster_row(number: int, values: dict[str, str]) -> RosterRow:
    raw_id = values.get("identifier") or values.get("sourcedid", "")
    name = " ".join(part for part in (values.get("givenname", ""), values.get("familyname", "")) if part)
    agents = roster_guardians.split_ids(values.get("agentsourcedids", ""))
    row = RosterRow(row=number, student_id=_fitted_id(raw_id), name=name, grade=values.get("grades", ""),
                    source_id=values.get("sourcedid", ""), agent_ids=agents)
    role = values.get("role", "").lower()
    if role in roster_guardians.GUARDIAN_ROLES and values.get("email") and values.get("status", "").lower() \
            != "tobedeleted":
        return dataclasses.replace(row, student_id="", guardian_email=values["email"],
                                   skip=f"parent/guardian {values['email']}")  # placed by link_oneroster_guardians
    if role != "student":
        return RosterRow(row=number, student_id=row.student_id, name=name,
                         skip=f"role {role} is not a student" if role else "no role given, not a student")
    if values.get("status", "").lower() == "tobedeleted":
        return RosterRow(row=number, student_id=row.student_id, name=name,
                         skip="status is tobedeleted; archive the student by hand if they have left")
    try:
        stack_id_validated(row.student_id, field="student_id")
    except InvalidInput:
        return _with_problem(row, "has neither an identifier nor a sourcedId usable as a student id")
    return _checked_lengths(row)


def _fitted_id(raw: str) -> str:
    """A OneRoster id in the stack-id alphabet: other characters become '-' (GUIDs pass unchanged)."""
    fitted = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in raw.strip())
    return fitted.strip("-")[:STACK_ID_MAX_LENGTH]


def _checked_lengths(row: RosterRow) -> RosterRow:
    if len(row.name) > NAME_MAX_LENGTH:
        return _with_problem(row, f"name is longer than {NAME_MAX_LENGTH} characters")
    if len(row.grade) > GRADE_MAX_LENGTH:
        return _with_problem(row, f"grade is longer than {GRADE_MAX_LENGTH} characters")
    return row


def _with_problem(row: RosterRow, problem: str) -> RosterRow:
    return dataclasses.replace(row, problem=problem, skip="")


# --- planning ----------------------------------------------------------------------------------


def roster_plan(*, principal: Principal, roster: ParsedRoster) -> RosterPlan:
    """What importing `roster` into the caller's school would do, row by row (writes nothing).
    Only a school admin (or a school key) imports a roster (403 otherwise)."""
    ensure_may_manage_organization(principal)
    teachers = _teachers_by_email(principal)
    candidates = [row for row in roster.rows if not row.problem and not row.skip]
    existing = _existing(principal, {row.student_id for row in candidates})
    rows_of: dict[str, list[int]] = {}
    for row in candidates:
        rows_of.setdefault(row.student_id, []).append(row.row)
    guardians = roster_guardians.school_guardians(principal, [found.stack for found in existing.values()])
    planned = [_planned(row, rows_of, existing, teachers, guardians) for row in roster.rows]
    plan = RosterPlan(format=roster.format, rows=planned)
    creates = plan.counts[Outcome.CREATE.value]
    room = stack_room(organization=principal.organization)
    if room is not None and creates > room:
        plan.quota_exceeded = True
        plan.problems.append(
            f"This import would add {creates} student{'s' if creates != 1 else ''} but the plan has room for "
            f"{room} more: {stack_limit_message(principal.organization)}.")
    return plan


@dataclass(frozen=True)
class _Existing:
    stack: Stack
    teacher_ids: frozenset[int]


def _teachers_by_email(principal: Principal) -> dict[str, User]:
    """The school's teachers by lower-cased email (members_visible_to: never another school's)."""
    members = members_visible_to(principal).filter(role=Membership.Role.TEACHER).exclude(user__email="")
    return {member.user.email.lower(): member.user for member in members}


def _existing(principal: Principal, student_ids: set[str]) -> dict[str, _Existing]:
    stacks = stacks_visible_to(principal).filter(slug__in=student_ids).select_related("organization")
    found = {stack.slug: stack for stack in stacks}
    assigned: dict[int, set[int]] = {}
    for stack_id, user_id in TeacherAssignment.objects.filter(stack__in=found.values()).values_list(
            "stack_id", "user_id"):
        assigned.setdefault(stack_id, set()).add(user_id)
    return {slug: _Existing(stack, frozenset(assigned.get(stack.pk, ()))) for slug, stack in found.items()}


def _planned(row: RosterRow, rows_of: dict[str, list[int]], existing: dict[str, _Existing],
             teachers: dict[str, User], guardians: roster_guardians.SchoolGuardians) -> PlannedRow:
    planned = PlannedRow(row=row.row, student_id=row.student_id, name=row.name, grade=row.grade,
                         teacher_emails=row.teacher_emails, outcome=Outcome.ERROR)
    if row.skip:
        planned.outcome, planned.details = Outcome.SKIP, [row.skip]
        return planned
    problems = [row.problem] if row.problem else []
    first = rows_of.get(row.student_id, [row.row])[0]
    if first != row.row:  # the first occurrence stands; each repeat is the bad row
        problems.append(f"duplicate student_id {row.student_id}: already on row {first}")
    assign: list[User] = []
    for email in row.teacher_emails:
        teacher = teachers.get(email.lower())
        if teacher is None:
            problems.append(f"teacher_email {email} is not a teacher of this school")
        elif teacher not in assign:
            assign.append(teacher)
    current = existing.get(row.student_id)
    if current is not None and current.stack.kind != Stack.Kind.STUDENT:
        problems.append(f"student_id {row.student_id} is already used by an agent stack")
    steps, guardian_problems = roster_guardians.guardian_steps(row.guardians, current.stack if current else None,
                                                               guardians)
    problems += guardian_problems
    planned.guardian_steps = steps
    if problems:
        planned.details = problems
        return planned
    if current is None:
        planned.outcome = Outcome.CREATE
        planned.set_name, planned.set_grade, planned.assign = row.name, row.grade, assign
        planned.details = ["new student"] + [f"assign teacher {teacher.email}" for teacher in assign]
        planned.details += [step.detail for step in steps]
        return planned
    stack = current.stack
    planned.stack = stack
    if row.name and row.name != stack.display_name:
        planned.set_name = row.name
        planned.details.append(f"name “{stack.display_name}” → “{row.name}”")
    if row.grade and row.grade != stack.grade:
        planned.set_grade = row.grade
        planned.details.append(f"grade “{stack.grade}” → “{row.grade}”")
    planned.assign = [teacher for teacher in assign if teacher.pk not in current.teacher_ids]
    planned.details += [f"assign teacher {teacher.email}" for teacher in planned.assign]
    planned.details += [step.detail for step in steps if step.action not in ("linked", "invited")]
    changed = bool(planned.details)
    if stack.is_archived:
        planned.details.append("archived: stays archived")
    planned.outcome = Outcome.UPDATE if changed else Outcome.UNCHANGED
    if not changed:
        planned.details.insert(0, "already up to date")
    return planned


# --- applying ----------------------------------------------------------------------------------


@transaction.atomic
def roster_apply(*, principal: Principal, roster: ParsedRoster, ip: str | None = None) -> RosterPlan:
    """Plan `roster` again and, if the plan is clean, apply all of it in one transaction.

    Returns the plan: `applied` False when a row has an error or the quota has no room (nothing
    was written). A service refusing mid-way (a student created meanwhile by someone else: 409;
    the quota taken meanwhile: 402) raises, and the transaction takes every row back with it.
    """
    plan = roster_plan(principal=principal, roster=roster)
    if not plan.ok:
        return plan
    organization = principal.organization
    assigned = 0
    for row in plan.rows:
        if row.outcome is Outcome.CREATE:
            stack = stack_create(organization=organization, slug=row.student_id, display_name=row.set_name or "",
                                 grade=row.set_grade or "", principal=principal, ip=ip)
        elif row.outcome is Outcome.UPDATE and row.stack is not None:
            stack = row.stack
            if row.set_name is not None or row.set_grade is not None:
                stack_update(stack=stack, display_name=row.set_name, grade=row.set_grade, principal=principal, ip=ip)
        else:
            continue
        for teacher in row.assign:
            teacher_assign(stack=stack, teacher=teacher, principal=principal, ip=ip)
            assigned += 1
        plan.invitations += roster_guardians.apply_guardian_steps(principal=principal, stack=stack,
                                                                  steps=row.guardian_steps, ip=ip)
    counts = plan.counts
    # Counts only: the audit log holds no names or ids of students (each change has its own event).
    metadata = {"format": plan.format.value, "rows": len(plan.rows), "created": counts["create"],
                "updated": counts["update"], "unchanged": counts["unchanged"], "skipped": counts["skip"],
                "teachers_assigned": assigned}
    if plan.invitations:
        metadata["guardians_invited"] = len(plan.invitations)
    audit_record(organization=organization, action="roster.imported", principal=principal, target_type="roster",
                 ip=ip, metadata=metadata)
    plan.applied = True
    return plan


# --- one student --------------------------------------------------------------------------------


@transaction.atomic
def student_stack_create(*, principal: Principal, student_id: str, display_name: str = "", grade: str = "",
                   teacher_public_id: str | None = None, ip: str | None = None) -> Stack:
    """One student's stack, with its teacher if one is named — both or neither. Errors name the
    form's `student_id` field: an invalid id (400), an id in use (409); the stack quota (402)."""
    ensure_may_manage_organization(principal)
    slug = stack_id_validated(student_id, field="student_id")
    teacher = school_teacher(principal, teacher_public_id) if teacher_public_id else None
    try:
        stack = stack_create(organization=principal.organization, slug=slug, display_name=display_name.strip(),
                             grade=grade.strip(), principal=principal, ip=ip)
    except Conflict:
        raise Conflict("A student with this ID already exists.", code="stack_exists",
                       fields={"student_id": ["Already exists."]}) from None
    if teacher is not None:
        teacher_assign(stack=stack, teacher=teacher, principal=principal, ip=ip)
    return stack


# --- reads for the roster pages ------------------------------------------------------------------


def school_teachers(principal: Principal) -> list[User]:
    """The caller's school's teachers (for assignment forms), by email."""
    members = members_visible_to(principal).filter(role=Membership.Role.TEACHER).order_by("user__email")
    return [member.user for member in members]


def school_teacher(principal: Principal, public_id: object) -> User:
    """A teacher of the caller's school by public id; 404 for anyone else (another school's too)."""
    member = None
    if plausible_identifier(public_id, max_length=32):
        member = members_visible_to(principal).filter(role=Membership.Role.TEACHER, user__public_id=public_id).first()
    if member is None:
        raise NotFound("No such teacher in this school.", code="teacher_not_found")
    return member.user


def stack_teacher(stack: Stack, public_id: object) -> User:
    """A person assigned to `stack`, by public id; 404 if no such assignment."""
    assignment = None
    if plausible_identifier(public_id, max_length=32):
        assignment = TeacherAssignment.objects.filter(stack=stack, user__public_id=public_id).select_related(
            "user").first()
    if assignment is None:
        raise NotFound("That teacher is not assigned to this student.", code="assignment_not_found")
    return assignment.user


def stack_teachers(stack: Stack) -> list[User]:
    """The teachers assigned to `stack` (a stack the caller reached through stack_for_principal)."""
    return [assignment.user for assignment in
            TeacherAssignment.objects.filter(stack=stack).select_related("user").order_by("user__email")]
