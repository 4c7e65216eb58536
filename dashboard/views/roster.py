"""Dashboard: the roster — add one student, import a roster CSV (preview, then apply), archive and
unarchive a student, assign and unassign teachers. School admins only.

The rules live below this module: reading, planning and applying an import in stacks.roster, every
write in stacks.services (audited with the admin and their address), which stack the admin reaches
in stacks.selectors.stack_for_principal. Between the preview and "Apply import" the uploaded file
waits in the cache under a random token bound to the admin and the school (the CSV carries
students' names, so it is not sent back through the page); applying reads and plans it again.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from django import forms
from django.contrib import messages
from django.core.cache import cache
from django.core.paginator import Paginator
from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.invitations import invitation_email_send
from accounts.principal import Principal
from dashboard.access import ADMINS, dashboard_page, request_ip
from memoryhub.errors import Conflict, DomainError, InvalidInput, NotFound, QuotaExceeded
from stacks.models import Stack, TeacherAssignment
from stacks.roster import (
    MAX_FILE_BYTES,
    MAX_ROWS,
    RosterPlan,
    ensure_roster_size,
    roster_apply,
    roster_parsed,
    roster_plan,
    school_teacher,
    school_teachers,
    stack_teacher,
    stack_teachers,
    student_stack_create,
)
from stacks.selectors import stack_for_principal, stacks_visible_to
from stacks.services import stack_archive, stack_unarchive, teacher_assign, teacher_unassign

NAV_SECTION = "dashboard:roster"  # the navigation entry lit on every page of this module
PREVIEW_SECONDS = 30 * 60  # how long a previewed file waits for "Apply import"
PREVIEW_ROWS_SHOWN = 2000  # the table of every row; errors are always listed in full
STUDENTS_PER_PAGE = 50
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")
EXAMPLES = {"plain": "dashboard/roster/example-plain.csv", "oneroster": "dashboard/roster/example-oneroster.csv"}


class ImportForm(forms.Form):
    upload = forms.FileField(label="Roster CSV file",
                           help_text=f"A .csv file up to {MAX_FILE_BYTES // (1024 * 1024)} MB and {MAX_ROWS:,} rows.",
                           widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv"}))


class StudentForm(forms.Form):
    student_id = forms.CharField(label="Student ID", max_length=100,
                                 help_text="The id the student's agent uses, e.g. student-4521: letters, digits, "
                                           "'-', '_' and '.'.")
    display_name = forms.CharField(label="Display name", max_length=200, required=False)
    grade = forms.CharField(label="Grade", max_length=32, required=False)
    teacher = forms.ChoiceField(label="Teacher", required=False)

    def __init__(self, *args: Any, teachers: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        teacher = self.fields["teacher"]
        assert isinstance(teacher, forms.ChoiceField)
        teacher.choices = [("", "No teacher yet"), *teachers]


def _teacher_choices(principal: Principal) -> list[tuple[str, str]]:
    return [(teacher.public_id, teacher.email or teacher.username) for teacher in school_teachers(principal)]


# --- the roster page and the import ---------------------------------------------------------------


@dashboard_page(roles=ADMINS)
def roster(request: HttpRequest, principal: Principal) -> HttpResponse:
    if request.method == "POST":
        if request.POST.get("step") == "apply":
            return _apply(request, principal)
        return _preview(request, principal)
    return _roster_page(request, principal)


def _roster_page(request: HttpRequest, principal: Principal, *, import_form: ImportForm | None = None,
                 import_error: str = "", status: int = 200) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:100].replace("\x00", "")
    stacks = stacks_visible_to(principal).order_by("slug").prefetch_related(
        Prefetch("teacher_assignments", queryset=TeacherAssignment.objects.select_related("user")))
    if query:
        stacks = stacks.filter(Q(slug__icontains=query) | Q(display_name__icontains=query))
    page = Paginator(stacks, STUDENTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/roster/roster.html", {
        "import_form": import_form or ImportForm(), "import_error": import_error,
        "student_form": StudentForm(teachers=_teacher_choices(principal)),
        "page": page, "query": query,
        "max_rows": MAX_ROWS,
    }, status=status)


def _preview(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return _roster_page(request, principal, import_form=form, status=400)
    upload = form.cleaned_data["upload"]
    try:
        ensure_roster_size(upload.size)  # before reading it
        data = upload.read(MAX_FILE_BYTES + 1)
        plan = roster_plan(principal=principal, roster=roster_parsed(data))
    except DomainError as error:  # not a roster file (400), too large (413)
        form.add_error("upload", error.message)
        return _roster_page(request, principal, import_form=form, status=error.status)
    token = secrets.token_urlsafe(24)
    cache.set(_cache_key(principal, token), {"data": data, "name": upload.name[:200]}, PREVIEW_SECONDS)
    return _preview_page(request, plan, token=token, filename=upload.name)


def _apply(request: HttpRequest, principal: Principal) -> HttpResponse:
    token = request.POST.get("token", "")
    stored = cache.get(_cache_key(principal, token)) if _TOKEN.fullmatch(token) else None
    if stored is None:
        return _roster_page(request, principal, status=400,
                            import_error="That preview has expired or was already applied. Upload the file again.")
    try:
        plan = roster_apply(principal=principal, roster=roster_parsed(stored["data"]), ip=request_ip(request))
    except DomainError as error:
        # Someone changed the school between the plan and its last row (e.g. created the same
        # student); the transaction took every row back.
        plan = roster_plan(principal=principal, roster=roster_parsed(stored["data"]))
        plan.problems.append(f"Nothing was imported: {error.message}")
        return _preview_page(request, plan, token=token, filename=stored["name"], status=error.status)
    if not plan.applied:
        return _preview_page(request, plan, token=token, filename=stored["name"])
    cache.delete(_cache_key(principal, token))
    counts = plan.counts
    # Guardians the file named are invited by e-mail; the links are not shown (docs/guardians.md).
    emailed = sum(invitation_email_send(invitation=new.invitation, link=request.build_absolute_uri(
        reverse("dashboard:invitation-accept", args=[new.token]))) for new in plan.invitations)
    invited = (f" {len(plan.invitations)} guardian invitation{'s' if len(plan.invitations) != 1 else ''} created, "
               f"{emailed} e-mailed." if plan.invitations else "")
    messages.success(request, f"Roster imported: {counts['create']} created, {counts['update']} updated, "
                              f"{counts['unchanged']} unchanged, {counts['skip']} skipped.{invited}")
    return redirect("dashboard:roster")


def _preview_page(request: HttpRequest, plan: RosterPlan, *, token: str, filename: str,
                  status: int | None = None) -> HttpResponse:
    if status is None:
        status = 200 if plan.ok else 402 if plan.quota_exceeded and not plan.errors else 400
    return render(request, "dashboard/roster/preview.html", {
        "plan": plan, "counts": plan.counts, "invitations": plan.guardian_invitations, "token": token,
        "filename": filename,
        "shown_rows": plan.rows[:PREVIEW_ROWS_SHOWN], "hidden_rows": max(0, len(plan.rows) - PREVIEW_ROWS_SHOWN),
        "import_form": ImportForm(), "nav_section": NAV_SECTION,
    }, status=status)


def _cache_key(principal: Principal, token: str) -> str:
    return f"dashboard:roster-preview:{principal.organization.pk}:{principal.user.pk}:{token}"


@dashboard_page(roles=ADMINS)
def roster_example(request: HttpRequest, principal: Principal, example: str) -> HttpResponse:
    """A small example file of each format, naming one of the school's own teachers if it has any."""
    template = EXAMPLES.get(example)
    if template is None:
        raise NotFound("There is no such example.")
    teachers = school_teachers(principal)
    teacher_email = teachers[0].email if teachers and teachers[0].email else "teacher@your-school.example"
    response = HttpResponse(render_to_string(template, {"teacher_email": teacher_email}),
                            content_type="text/csv; charset=utf-8")
    filename = "users.csv" if example == "oneroster" else "roster-example.csv"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# --- one student ----------------------------------------------------------------------------------


@dashboard_page(roles=ADMINS)
def student_create(request: HttpRequest, principal: Principal) -> HttpResponse:
    teachers = _teacher_choices(principal)
    if request.method != "POST":
        return render(request, "dashboard/roster/student_create.html",
                      {"form": StudentForm(teachers=teachers), "nav_section": NAV_SECTION})
    form = StudentForm(request.POST, teachers=teachers)
    status = 400
    if form.is_valid():
        data = form.cleaned_data
        try:
            stack = student_stack_create(principal=principal, student_id=data["student_id"],
                                         display_name=data["display_name"], grade=data["grade"],
                                         teacher_public_id=data["teacher"] or None, ip=request_ip(request))
        except DomainError as error:
            # A form's refusal is a 400 (a taken id included), except the plan's limit: 402.
            status = error.status if isinstance(error, QuotaExceeded) else 400
            if isinstance(error, InvalidInput) and "student_id" in error.fields:
                form.add_error("student_id", f"The student ID {error.fields['student_id'][0]}.")
            elif isinstance(error, Conflict) and "student_id" in error.fields:
                form.add_error("student_id", error.message)
            else:
                form.add_error(None, error.message)
        else:
            messages.success(request, f"Student {stack.slug} created.")
            return redirect("dashboard:student-manage", slug=stack.slug)
    return render(request, "dashboard/roster/student_create.html", {"form": form, "nav_section": NAV_SECTION},
                  status=status)


@dashboard_page(roles=ADMINS)
def student_manage(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    return _manage_page(request, principal, stack_for_principal(principal, slug))


def _manage_page(request: HttpRequest, principal: Principal, stack: Stack, *, error: str = "",
                 status: int = 200) -> HttpResponse:
    assigned = stack_teachers(stack)
    assigned_ids = {teacher.pk for teacher in assigned}
    available = [teacher for teacher in school_teachers(principal) if teacher.pk not in assigned_ids]
    return render(request, "dashboard/roster/manage.html", {
        "stack": stack, "assigned": assigned, "available": available, "error": error, "nav_section": NAV_SECTION,
    }, status=status)


@dashboard_page(roles=ADMINS)
@require_POST
def student_archive(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    stack = stack_archive(stack=stack_for_principal(principal, slug), principal=principal, ip=request_ip(request))
    messages.success(request, f"{stack.slug} is archived: its memories are kept, agents can no longer write.")
    return redirect("dashboard:student-manage", slug=stack.slug)


@dashboard_page(roles=ADMINS)
@require_POST
def student_unarchive(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    stack = stack_for_principal(principal, slug)
    try:
        stack = stack_unarchive(stack=stack, principal=principal, ip=request_ip(request))
    except DomainError as error:  # the plan's stack limit (402)
        return _manage_page(request, principal, stack, error=error.message, status=error.status)
    messages.success(request, f"{stack.slug} is active again.")
    return redirect("dashboard:student-manage", slug=stack.slug)


@dashboard_page(roles=ADMINS)
@require_POST
def student_teachers(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    stack = stack_for_principal(principal, slug)
    action = request.POST.get("action")
    public_id = request.POST.get("teacher", "")
    ip = request_ip(request)
    if action == "assign":
        if not public_id:
            return _manage_page(request, principal, stack, error="Choose a teacher to assign.", status=400)
        teacher = school_teacher(principal, public_id)
        teacher_assign(stack=stack, teacher=teacher, principal=principal, ip=ip)
        messages.success(request, f"{teacher.email or teacher.username} now sees {stack.slug}.")
    elif action == "unassign":
        teacher = stack_teacher(stack, public_id)
        teacher_unassign(stack=stack, teacher=teacher, principal=principal, ip=ip)
        messages.success(request, f"{teacher.email or teacher.username} no longer sees {stack.slug}; "
                                  "any key they issued for this student stops working.")
    else:
        raise InvalidInput("Unknown action.")
    return redirect(reverse("dashboard:student-manage", kwargs={"slug": stack.slug}))
