"""Dashboard: privacy — the school's privacy settings with its written retention policy, the erasure
certificates, and erasing a student or one memory (docs/privacy.md "The Privacy page").

School admins only (any other role gets a 404). Who may change the settings and what is valid is
memories.governance.privacy_settings (one audited call); which student or memory may be erased is
memories.selectors.stack_for_erasure after the one access decision (another school's student is a
404); the erasure itself, its audit entries and its certificate are memories.governance.erasure; which
certificates an admin sees is memories.selectors. Nothing here restates a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Organization
from accounts.principal import Principal
from dashboard.access import ADMINS, dashboard_page, request_ip
from memories.governance.consent import DEFAULT_CONSENT_TEXT
from memories.governance.erasure import (
    ASYNC_THRESHOLD,
    REQUESTED_BY_MAX,
    certificate_document,
    certificate_verify,
    memory_erase_request,
    stack_erase_request,
)
from memories.governance.privacy_settings import (
    CATEGORY_LABELS,
    CONSENT_TEXT_MAX,
    DEFAULTS,
    KIND_LABELS,
    REQUEST_DAYS_MAX,
    PrivacySettings,
    policy_sections,
    privacy_settings_get,
    privacy_settings_update,
    retention_rows,
)
from memories.lifecycle.ttl import RETENTION_MAX_DAYS
from memories.models import ErasureCertificate
from memories.privacy.grants import audience_for
from memories.privacy.redaction.rules import PII_CATEGORIES, RULES
from memories.selectors import erasure_certificate_get, erasure_certificates_of, memory_get, stack_for_erasure
from memoryhub.errors import InvalidInput
from stacks.models import Stack

CERTIFICATES_PER_PAGE = 25
NAV_SECTION = "dashboard:privacy"
# The rules every school's writes apply, whatever it chose (shown checked and disabled).
ALWAYS_REDACTED = tuple(rule.name.replace("_", " ") for rule in RULES if not rule.category)
GRANTS_CHOICES = (
    (Organization.EmptyGrantsPolicy.SCHOOL.value,
     "School staff who reach the student — admins, the teachers assigned to the student, and school keys"),
    (Organization.EmptyGrantsPolicy.OWNER.value,
     "Only the student's own agent — school staff see such a memory only if it names them"),
)


# --- settings -------------------------------------------------------------------------------------

def _sentence(label: str) -> str:
    return label[:1].upper() + label[1:]  # "IP addresses" stays so (str.capitalize lowers the rest)


def _retention_field(kind: str) -> str:
    return f"retention_{kind}"


class PrivacyForm(forms.Form):
    """The settings; the retention fields (one per kind, blank = no limit) are added per kind."""

    redaction_categories = forms.MultipleChoiceField(
        label="Personal details to redact", required=False, widget=forms.CheckboxSelectMultiple,
        choices=[(name, _sentence(CATEGORY_LABELS.get(name, name))) for name in PII_CATEGORIES])
    empty_grants_policy = forms.ChoiceField(
        label="Who may read a memory that does not say who may read it", choices=GRANTS_CHOICES,
        widget=forms.RadioSelect)
    keep_raw_originals = forms.BooleanField(
        label="Keep the original text of raw entries, encrypted", required=False,
        help_text="Off (the default): only the redacted text is ever stored. On: the original text of each raw "
                  "entry that redaction changed is kept as well, encrypted at rest with AES-256-GCM under the keys "
                  "the operator sets in <code>MEMORYHUB_ENCRYPTION_KEYS</code>; school admins and the student's "
                  "own agent can open it.")
    provision_stacks_on_push = forms.BooleanField(
        label="Create students' stacks on first push", required=False,
        help_text="Off (the default): a student's stack exists only once an admin adds the student, and a "
                  "school key's push to an unknown student id is refused. On: the school key's first "
                  "<code>kernle sync push</code> for a new student id creates that student's stack, within the "
                  "plan's stack limit.")
    # Families (docs/consent.md).
    consent_required = forms.BooleanField(
        label="Require a guardian's consent before agents write", required=False,
        help_text="On: agents may write to a student's memory only once a guardian consented on their child's "
                  "page or an admin recorded paper consent on the student's page; writes without it are "
                  "refused (<code>consent_required</code>).")
    consent_text = forms.CharField(
        label="What guardians agree to", required=False, max_length=CONSENT_TEXT_MAX,
        widget=forms.Textarea(attrs={"rows": 5, "placeholder": DEFAULT_CONSENT_TEXT}),
        help_text="Shown to guardians when they give consent, and kept with each consent. Empty: MemoryHub's "
                  "default text.")
    consent_withdrawal = forms.ChoiceField(
        label="When consent is withdrawn", widget=forms.RadioSelect, required=False, choices=(
            (Organization.ConsentWithdrawal.KEEP.value,
             "Keep the memory: agents stop writing; what is stored stays under the retention policy"),
            (Organization.ConsentWithdrawal.ERASE.value,
             "Erase the memory, with a certificate: agents stop writing and everything stored is erased"),
        ))
    guardians_may_pause = forms.BooleanField(
        label="Guardians may pause their child's memory", required=False,
        help_text="Admins may always pause and resume a student's memory from the student's page.")
    guardian_request_days = forms.IntegerField(
        label="Days to answer a guardian's request", required=False, min_value=1, max_value=REQUEST_DAYS_MAX,
        widget=forms.NumberInput(attrs={"class": "days"}),
        help_text="A guardian's request for a correction or a deletion is due this many days after it is made "
                  "(10 by default); it shows under \"Needs attention\" two days before.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for kind, label, _ in retention_rows(DEFAULTS):
            self.fields[_retention_field(kind)] = forms.IntegerField(
                label=label, required=False, min_value=1, max_value=RETENTION_MAX_DAYS,
                widget=forms.NumberInput(attrs={"placeholder": "no limit", "class": "days"}))

    @classmethod
    def of(cls, settings: PrivacySettings) -> PrivacyForm:
        initial: dict[str, Any] = {
            "redaction_categories": settings.redaction_categories,
            "empty_grants_policy": settings.empty_grants_policy,
            "keep_raw_originals": settings.keep_raw_originals,
            "provision_stacks_on_push": settings.provision_stacks_on_push,
            "consent_required": settings.consent_required,
            "consent_text": settings.consent_text,
            "consent_withdrawal": settings.consent_withdrawal,
            "guardians_may_pause": settings.guardians_may_pause,
            "guardian_request_days": settings.guardian_request_days,
        }
        initial.update({_retention_field(kind): days for kind, days in settings.retention_days.items()})
        return cls(initial=initial)

    def retention_fields(self) -> list[forms.BoundField]:
        return [self[_retention_field(kind)] for kind in KIND_LABELS]

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "retention_days": {kind: data[_retention_field(kind)] for kind in KIND_LABELS
                               if data.get(_retention_field(kind)) is not None},
            "redaction_categories": list(data["redaction_categories"]),
            "empty_grants_policy": data["empty_grants_policy"],
            "keep_raw_originals": data["keep_raw_originals"],
            "provision_stacks_on_push": data["provision_stacks_on_push"],
            **({"consent_required": data["consent_required"], "consent_text": data["consent_text"],
                "consent_withdrawal": data["consent_withdrawal"] or Organization.ConsentWithdrawal.KEEP.value,
                "guardians_may_pause": data["guardians_may_pause"],
                "guardian_request_days": data["guardian_request_days"] or DEFAULTS.guardian_request_days}
               if self._shows_consent() else {}),
        }

    def _shows_consent(self) -> bool:
        """Did the post come from a form with the families' section (its hidden `consent_settings`)? Only
        such a form changes those settings: an unticked box is simply absent from a post."""
        return bool(self.data.get("consent_settings"))

    def add_service_errors(self, error: InvalidInput) -> None:
        """The service's field errors (`retention_days.raw`, `empty_grants_policy`…) on the form's fields."""
        for name, problems in (error.fields or {}).items():
            setting, _, kind = str(name).partition(".")
            field = _retention_field(kind) if setting == "retention_days" and kind else setting
            for problem in problems if isinstance(problems, list) else [problems]:
                self.add_error(field if field in self.fields else None, str(problem))
        if not error.fields:
            self.add_error(None, error.message)


def _index(request: HttpRequest, principal: Principal, *, form: PrivacyForm | None = None,
           status: int = 200) -> HttpResponse:
    settings = privacy_settings_get(principal)
    certificates = Paginator(erasure_certificates_of(principal), CERTIFICATES_PER_PAGE).get_page(
        request.GET.get("page"))
    form = form or PrivacyForm.of(settings)
    return render(request, "dashboard/privacy/index.html", {
        "form": form,
        # Each kind's field beside what a new school starts with.
        "retention_fields": [(field, DEFAULTS.retention_days.get(kind))
                             for field, kind in zip(form.retention_fields(), KIND_LABELS, strict=True)],
        "always_redacted": ALWAYS_REDACTED,
        "policy": policy_sections(settings, school=principal.organization.name,
                                  access_log_days=principal.organization.access_log_retention_days),
        "page": certificates,
    }, status=status)


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def privacy(request: HttpRequest, principal: Principal) -> HttpResponse:
    if request.method != "POST":
        return _index(request, principal)
    form = PrivacyForm(request.POST)
    if not form.is_valid():
        return _index(request, principal, form=form, status=400)
    try:
        privacy_settings_update(principal=principal, changes=form.changes(), ip=request_ip(request))
    except InvalidInput as error:
        form.add_service_errors(error)
        return _index(request, principal, form=form, status=400)
    messages.success(request, "Privacy settings saved. The policy below says what they mean.")
    return redirect("dashboard:privacy")


# --- certificates ---------------------------------------------------------------------------------

_COUNT_LABELS = {"revisions": "Revisions (history of changes)", "salience_rows": "Salience rows",
                 "checkpoints": "Checkpoints", "boot_config_entries": "Boot config entries",
                 "sync_watermarks": "Sync positions", "daily_activity_rows": "Daily activity rows",
                 "change_events": "Change events"}


def _count_label(key: str) -> str:
    kind = key.removeprefix("memory:")
    if kind != key:
        return f"Memories: {KIND_LABELS.get(kind, kind).lower()}"
    return _COUNT_LABELS.get(key, key.replace("_", " ").capitalize())


@dataclass(frozen=True)
class Progress:
    erased: int
    left: int | None  # memories still in the stack (a stack erasure), None for one memory

    @property
    def total(self) -> int | None:
        return None if self.left is None else self.erased + self.left


def _progress(cert: ErasureCertificate) -> Progress:
    erased = sum(n for key, n in (cert.counts or {}).items() if key.startswith("memory:"))
    left = cert.stack.memory_count if cert.scope == ErasureCertificate.Scope.STACK and cert.stack else None
    return Progress(erased=erased, left=left)


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET"])
def certificate(request: HttpRequest, principal: Principal, certificate_id: str) -> HttpResponse:
    cert = erasure_certificate_get(principal, certificate_id)
    document = certificate_document(cert)
    finished = cert.status in (ErasureCertificate.Status.DONE, ErasureCertificate.Status.FAILED)
    polled = bool(getattr(request, "htmx", False))
    if polled and finished:
        # The progress box polls this page; once the job has ended the whole page is shown afresh.
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
        return response
    context = {"cert": cert, "document": document, "finished": finished, "nav_section": NAV_SECTION,
               "counts": sorted((_count_label(key), n) for key, n in document["counts"].items()),
               "valid": certificate_verify(document), "progress": _progress(cert),
               "printable_url": reverse("erasure-detail", args=[cert.pk]) + "?format=html",
               "json_url": reverse("erasure-detail", args=[cert.pk]),
               "verify_url": reverse("erasure-verify", args=[cert.pk])}
    template = "dashboard/privacy/_progress.html" if polled else "dashboard/privacy/certificate.html"
    return render(request, template, context)


# --- erasing --------------------------------------------------------------------------------------

def _requested_by_field() -> forms.CharField:
    return forms.CharField(
        label="Requested by (optional)", required=False, max_length=REQUESTED_BY_MAX,
        help_text="At whose request, as the certificate should say — e.g. “Parent of the student, letter of "
                  "20 November 2026”. Left empty, the certificate says it was the school's own decision.")


def _requested_by(principal: Principal, value: str) -> str:
    return value or f"{principal.organization.name} (the school's own decision; no outside request given)"


class EraseStudentForm(forms.Form):
    confirm = forms.CharField(label="Type the student's name or ID to confirm", max_length=200, strip=True)
    requested_by = _requested_by_field()

    def __init__(self, *args: Any, stack: Stack, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stack = stack

    def clean_confirm(self) -> str:
        typed = self.cleaned_data["confirm"]
        name = (self.stack.display_name or "").strip()
        if typed == self.stack.slug or (name and typed.casefold() == name.casefold()):
            return self.stack.slug  # what memories.governance.erasure checks
        raise forms.ValidationError("That is not this student's name or ID: nothing was erased.")

    def clean_requested_by(self) -> str:
        value = self.cleaned_data["requested_by"]
        if "\x00" in value:
            raise forms.ValidationError("Contains a character that is not allowed.")
        return value


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def student_erase(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    stack = stack_for_erasure(principal, slug)
    form = EraseStudentForm(request.POST if request.method == "POST" else None, stack=stack)
    if request.method != "POST" or not form.is_valid():
        return render(request, "dashboard/privacy/erase_student.html",
                      {"stack": stack, "form": form, "async_threshold": ASYNC_THRESHOLD},
                      status=400 if request.method == "POST" else 200)
    cert = stack_erase_request(principal=principal, stack=stack, confirm=form.cleaned_data["confirm"],
                               requested_by=_requested_by(principal, form.cleaned_data["requested_by"]),
                               ip=request_ip(request))
    if cert.status == ErasureCertificate.Status.DONE:
        messages.success(request, f"{stack.display_name or stack.slug} was erased. This is the certificate.")
    else:
        messages.info(request, f"Erasing {stack.display_name or stack.slug}: this page shows the progress.")
    return redirect("dashboard:erasure", cert.pk)


class EraseMemoryForm(forms.Form):
    requested_by = _requested_by_field()


@dashboard_page(roles=ADMINS)
@require_POST
def memory_erase(request: HttpRequest, principal: Principal, slug: str, memory_id: str) -> HttpResponse:
    stack = stack_for_erasure(principal, slug)
    # What the admin may see of the stack is what they may erase (the detail page's own read).
    memory = memory_get(stack=stack, memory_id=memory_id, audience=audience_for(principal, stack_id=stack.pk))
    form = EraseMemoryForm(request.POST)
    if not form.is_valid() or "\x00" in form.cleaned_data["requested_by"]:
        raise InvalidInput("“Requested by” is too long or holds a character that is not allowed; nothing was "
                           "erased.", fields={"requested_by": [f"At most {REQUESTED_BY_MAX} characters."]})
    cert = memory_erase_request(principal=principal, memory=memory,
                                requested_by=_requested_by(principal, form.cleaned_data["requested_by"]),
                                ip=request_ip(request))
    messages.success(request, "The memory was erased. This is the certificate.")
    return redirect("dashboard:erasure", cert.pk)
