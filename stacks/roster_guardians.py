"""Guardians in a roster import (docs/guardians.md "Guardians in the roster", stacks/roster.py).

* The plain CSV's optional `guardian_email` column (several addresses separated by ';') names a
  student's parents or guardians.
* In a OneRoster 1.1 `users.csv`, rows with the role `parent`, `guardian` or `relative` are guardians:
  their `email` is the address, `givenName familyName` the name, and `agentSourcedIds` (comma
  separated) the `sourcedId`s of their children in the same file. A student row's own
  `agentSourcedIds` naming such rows links them too. A guardian row becomes no stack: it is shown
  as skipped, saying which student rows it is imported with.

Planning says per student what happens to each address — invite (a new guardian invitation),
link (already a guardian of the school), add to their pending invitation, or nothing (already
linked) — and refuses a row naming an invalid address or a member of the school's staff. Applying
goes through stacks.guardians.guardian_invite, so every step is audited as if made by hand and new
invitations are e-mailed by the caller (their links are not shown: docs/guardians.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from accounts.invitations import NewInvitation
from accounts.models import Invitation, Membership
from accounts.principal import Principal
from accounts.services import normalized_email
from memoryhub.errors import InvalidInput
from stacks.guardians import NAME_MAX, guardian_invite
from stacks.models import GuardianLink, Stack

GUARDIAN_ROLES = frozenset({"parent", "guardian", "relative"})


@dataclass(frozen=True)
class GuardianStep:
    email: str
    name: str
    action: str  # "invite", "link", "add_to_pending"; nothing to do: "linked", "invited" (pending)

    @property
    def detail(self) -> str:
        return {"invite": f"invite guardian {self.email}", "link": f"link guardian {self.email}",
                "add_to_pending": f"add to {self.email}'s pending guardian invitation",
                "linked": f"guardian {self.email} already linked",
                "invited": f"guardian {self.email} already invited"}[self.action]


# --- reading -------------------------------------------------------------------------------------


def plain_guardians(values: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """(email, name) of the plain CSV's `guardian_email` cell."""
    return tuple((email.strip(), "") for email in values.get("guardian_email", "").split(";") if email.strip())


def split_ids(cell: str) -> tuple[str, ...]:
    """A OneRoster list of sourcedIds (comma separated; ';' accepted too)."""
    return tuple(part.strip() for part in cell.replace(";", ",").split(",") if part.strip())


def link_oneroster_guardians(rows: list[Any]) -> list[Any]:
    """Attach each OneRoster guardian row's address to the student rows it names (either side's
    `agentSourcedIds`), and mark the guardian row as skipped with where it went. `rows` are
    stacks.roster.RosterRow: guardians carry `guardian_email` and `agent_ids`, students `source_id`."""
    students = {row.source_id: index for index, row in enumerate(rows) if row.source_id and not row.guardian_email}
    guardians = {row.source_id: row for row in rows if row.guardian_email and row.source_id}
    added: dict[int, list[tuple[str, str]]] = {}
    placed: dict[int, list[int]] = {}
    for guardian in (row for row in rows if row.guardian_email):
        for agent in guardian.agent_ids:
            if agent in students:
                added.setdefault(students[agent], []).append((guardian.guardian_email, guardian.name))
                placed.setdefault(guardian.row, []).append(rows[students[agent]].row)
    for index in students.values():
        for agent in rows[index].agent_ids:
            guardian = guardians.get(agent)
            if guardian is not None and (guardian.guardian_email, guardian.name) not in added.get(index, []):
                added.setdefault(index, []).append((guardian.guardian_email, guardian.name))
                placed.setdefault(guardian.row, []).append(rows[index].row)
    out = []
    for index, row in enumerate(rows):
        if row.guardian_email:
            where = placed.get(row.row)
            skip = (f"parent/guardian {row.guardian_email}: imported with the student on row "
                    f"{', '.join(str(n) for n in sorted(set(where)))}" if where
                    else f"parent/guardian {row.guardian_email} of no student in this file")
            out.append(dataclasses.replace(row, skip=skip))
        elif index in added:
            out.append(dataclasses.replace(row, guardians=tuple(dict.fromkeys(row.guardians + tuple(added[index])))))
        else:
            out.append(row)
    return out


# --- planning ------------------------------------------------------------------------------------


@dataclass
class SchoolGuardians:
    """What the school has, read once per plan: members by address and role, pending guardian
    invitations (with those the plan's earlier rows will create), and the existing links of the
    stacks in the file."""

    roles: dict[str, str]
    pending: set[str]
    links: frozenset[tuple[int, str]]  # (stack id, lower-cased guardian email)
    invited: frozenset[tuple[int, str]]  # the same, for pending invitations naming the stack


def school_guardians(principal: Principal, stacks: list[Stack]) -> SchoolGuardians:
    organization_id = principal.organization.pk
    roles = {email.lower(): role for email, role in Membership.objects.filter(organization_id=organization_id)
             .exclude(user__email="").values_list("user__email", "role")}
    invited = Invitation.objects.filter(organization_id=organization_id, role=Membership.Role.GUARDIAN,
                                        accepted_at__isnull=True, revoked_at__isnull=True,
                                        expires_at__gt=timezone.now()).values_list("email", flat=True)
    pending = {email.lower() for email in invited}
    links = frozenset((stack_id, email.lower()) for stack_id, email in GuardianLink.objects.filter(
        stack__in=stacks).values_list("stack_id", "user__email"))
    naming = Invitation.guardian_of.through.objects.filter(
        stack__in=stacks, invitation__organization_id=organization_id, invitation__role=Membership.Role.GUARDIAN,
        invitation__accepted_at__isnull=True, invitation__revoked_at__isnull=True,
        invitation__expires_at__gt=timezone.now())
    named = frozenset((stack_id, email.lower()) for stack_id, email in naming.values_list("stack_id",
                                                                                          "invitation__email"))
    return SchoolGuardians(roles=roles, pending=pending, links=links, invited=named)


def guardian_steps(guardians: tuple[tuple[str, str], ...], stack: Stack | None,
                   school: SchoolGuardians) -> tuple[list[GuardianStep], list[str]]:
    """The steps for one student's guardians, and the row's problems (bad or staff addresses)."""
    steps: list[GuardianStep] = []
    problems: list[str] = []
    for raw, name in guardians:
        try:
            email = normalized_email(raw, field="guardian_email")
        except InvalidInput:
            problems.append(f"guardian_email {raw} is not a valid e-mail address")
            continue
        key = email.lower()
        role = school.roles.get(key)
        if role is not None and role != Membership.Role.GUARDIAN:
            problems.append(f"guardian_email {email} belongs to a member of staff ({role}) of this school")
        elif stack is not None and (stack.pk, key) in school.links:
            steps.append(GuardianStep(email, name[:NAME_MAX], "linked"))
        elif stack is not None and (stack.pk, key) in school.invited:
            steps.append(GuardianStep(email, name[:NAME_MAX], "invited"))
        elif role == Membership.Role.GUARDIAN:
            steps.append(GuardianStep(email, name[:NAME_MAX], "link"))
        elif key in school.pending or any(step.email.lower() == key for step in steps):
            steps.append(GuardianStep(email, name[:NAME_MAX], "add_to_pending"))
        else:
            steps.append(GuardianStep(email, name[:NAME_MAX], "invite"))
            school.pending.add(key)  # a later row of the same family joins this invitation
    return steps, problems


# --- applying ------------------------------------------------------------------------------------


def apply_guardian_steps(*, principal: Principal, stack: Stack, steps: list[GuardianStep],
                         ip: str | None) -> list[NewInvitation]:
    """Carry out one student's steps (in the import's transaction); returns the new invitations,
    for the caller to e-mail. A second student of the same family in the same file joins the
    invitation the first one created."""
    created = []
    for step in steps:
        if step.action in ("linked", "invited"):
            continue
        done = guardian_invite(principal=principal, stack=stack, email=step.email, name=step.name, ip=ip)
        if done.new is not None:
            created.append(done.new)
    return created
