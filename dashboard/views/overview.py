"""Dashboard: the school overview (`/dashboard/`), for school admins and teachers.

What is shown, and to whom, is dashboard.overview's (built on stacks.selectors.stacks_visible_to);
this view reads the GET filters, and renders. A billing user is sent to the billing page, the one
page that is theirs, and a guardian to their children (dashboard/views/families.py). An htmx
request aimed at the stack table (sorting, filtering, paging) gets the
table alone, without the summary's queries.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat

from accounts.principal import Principal
from dashboard import overview as read_model
from dashboard.access import BILLING, GUARDIAN, STAFF, dashboard_page

TABLE_TARGET = "stacks-panel"
MB = 1024 * 1024


class StackFilterForm(forms.Form):
    q = forms.CharField(label="Search", required=False, max_length=100, strip=True,
                        widget=forms.TextInput(attrs={"type": "search", "placeholder": "Name or stack id"}))
    teacher = forms.TypedChoiceField(label="Teacher", required=False, coerce=int, empty_value=None)
    status = forms.ChoiceField(label="Status", required=False,
                               choices=[("", "Any status"), *((s, s.capitalize()) for s in read_model.STATUS_CHOICES)],
                               widget=forms.Select(attrs={"data-autosubmit": ""}))
    sort = forms.ChoiceField(label="Sort", required=False, choices=[(s, s) for s in read_model.SORT_CHOICES],
                             widget=forms.HiddenInput)
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args: Any, teachers: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["teacher"]
        assert isinstance(field, forms.TypedChoiceField)
        field.choices = [("", "Any teacher"), *teachers]
        field.widget.attrs["data-autosubmit"] = ""
        if not teachers:  # a teacher's table holds only their own stacks
            del self.fields["teacher"]

    def filters(self) -> read_model.StackFilters:
        data = self.cleaned_data
        return read_model.StackFilters(search=data.get("q") or "", teacher_id=data.get("teacher"),
                                       status=data.get("status") or "",
                                       sort=data.get("sort") or read_model.DEFAULT_SORT)


@dashboard_page(roles=STAFF | {BILLING, GUARDIAN})
def overview(request: HttpRequest, principal: Principal) -> HttpResponse:
    if principal.role == BILLING:
        return redirect("dashboard:billing")
    if principal.role == GUARDIAN:
        return redirect("dashboard:families")  # a family's one page: their children
    teachers = read_model.teacher_choices(principal)
    form = StackFilterForm(request.GET, teachers=teachers)
    status = 200
    if form.is_valid():
        filters, page_number = form.filters(), form.cleaned_data.get("page")
    else:  # show what was wrong above the unfiltered table
        filters, page_number, status = read_model.StackFilters(), 1, 400
    page, rows = read_model.stack_page(principal, filters, page_number)
    context: dict[str, Any] = {
        "form": form, "page": page, "rows": rows, "sort": filters.sort, "filtered": _filtered(filters),
        "sort_links": _sort_links(request, filters.sort), "table_target": TABLE_TARGET,
    }
    htmx = getattr(request, "htmx", None)
    if htmx and htmx.target == TABLE_TARGET:
        return render(request, "dashboard/overview/_stacks.html", context, status=status)
    context.update(_summary_context(principal))
    return render(request, "dashboard/overview/overview.html", context, status=status)


def _filtered(filters: read_model.StackFilters) -> bool:
    return bool(filters.search or filters.teacher_id is not None or filters.status)


def _sort_links(request: HttpRequest, current: str) -> dict[str, dict[str, Any]]:
    """Per column: the query string that sorts by it (ascending first, then toggling), and its
    aria-sort state. Filters are kept; the page goes back to 1."""
    links = {}
    for name in read_model.SORT_FIELDS:
        active = current.lstrip("-") == name
        descending = current.startswith("-")
        target = (name if descending else f"-{name}") if active else name
        query = request.GET.copy()
        query["sort"] = target
        query.pop("page", None)
        links[name] = {"query": query.urlencode(),
                       "aria": ("descending" if descending else "ascending") if active else None}
    return links


def _summary_context(principal: Principal) -> dict[str, Any]:
    totals = read_model.summary(principal)
    quota = read_model.storage_quota(principal, totals.bytes_used)
    per_day = read_model.written_per_day(principal)
    forgetting = read_model.forgetting_per_week(principal)
    return {
        "organization": principal.organization,
        "is_admin": principal.is_org_wide,
        "summary": totals,
        "quota": quota,
        "attention": read_model.needs_attention(principal),
        "job_runs": read_model.latest_job_runs(principal),
        "written_total": sum(n for _, n in per_day),
        "written_chart": {
            "type": "bar", "labels": [day.strftime("%d %b") for day, _ in per_day],
            "datasets": [{"label": "Memories written", "data": [n for _, n in per_day]}],
            "y_label": "memories", "stacked": False,
        },
        # A plan without a limit has no bar to fill: the page shows the figure instead.
        "storage_chart": _storage_chart(quota) if quota is not None and quota.limit is not None else None,
        "forgetting_chart": {
            "type": "bar", "labels": [f"Week of {week.strftime('%d %b')}" for week in forgetting.weeks],
            "datasets": [{"label": "Forgotten by decay", "data": forgetting.forgotten},
                         {"label": "Purged (retention, expiry)", "data": forgetting.purged}],
            "y_label": "memories", "stacked": True,
        } if forgetting is not None else None,
        "forgetting_total": (sum(forgetting.forgotten) + sum(forgetting.purged)) if forgetting is not None else 0,
    }


def _storage_chart(quota: read_model.Quota) -> dict[str, Any]:
    """One stacked bar: used and still free, in MB, up to the plan's limit (a plan with one)."""
    assert quota.limit is not None
    used = round(quota.used / MB, 2)
    free = max(0.0, round((quota.limit - quota.used) / MB, 2))
    return {"type": "bar", "labels": [f"{quota.plan} plan"], "y_label": "MB", "stacked": True,
            "datasets": [{"label": f"Used ({filesizeformat(quota.used)})", "data": [used]},
                         {"label": f"Free of {quota.label}", "data": [free], "color": "#9aa3b5"}],
            "max": round(quota.limit / MB, 2)}
