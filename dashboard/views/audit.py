"""Dashboard: the school's audit log — who did what, to what, when and from where.

Which events a caller may read is accounts.selectors.audit_events_visible_to (school admins: their
school's events); this page only narrows that set with the filters the admin chose and pages it.
Events never hold secrets or memory text (accounts.models.AuditEvent), so the metadata is shown as
it is stored, compactly.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

from accounts.models import AuditEvent
from accounts.principal import Principal
from accounts.selectors import audit_events_visible_to, members_visible_to
from dashboard.access import ADMINS, dashboard_page

PAGE_SIZE = 50
METADATA_SHOWN = 6  # keys shown inline; the rest are counted ("+2 more")
CSV_MAX_ROWS = 100_000  # a download is of a filtered view; this keeps one request bounded


class AuditFilterForm(forms.Form):
    action = forms.ChoiceField(required=False, label="Action")
    actor = forms.TypedChoiceField(required=False, label="Who", coerce=int, empty_value=None)
    target = forms.CharField(required=False, max_length=128, label="Target contains")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, data: Any, *, actions: list[str], actors: list[tuple[int, str]]) -> None:
        super().__init__(data)
        action_field = self.fields["action"]
        actor_field = self.fields["actor"]
        assert isinstance(action_field, forms.ChoiceField) and isinstance(actor_field, forms.ChoiceField)
        action_field.choices = [("", "Any action"), *[(a, readable_action(a)) for a in actions]]
        actor_field.choices = [("", "Anyone"), *actors]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and until < since:
            self.add_error("until", "The end date is before the start date.")
        return cleaned


def readable_action(action: str) -> str:
    """`key.issued` → "Key issued", `stack.teacher_assigned` → "Stack teacher assigned"."""
    words = action.replace(".", " ").replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _filtered(events: QuerySet[AuditEvent], cleaned: dict[str, Any]) -> QuerySet[AuditEvent]:
    if cleaned.get("action"):
        events = events.filter(action=cleaned["action"])
    if cleaned.get("actor") is not None:
        events = events.filter(actor_id=cleaned["actor"])
    if cleaned.get("target"):
        term = cleaned["target"].strip()
        events = events.filter(Q(target_id__icontains=term) | Q(target_type__icontains=term))
    zone = timezone.get_current_timezone()
    if cleaned.get("since"):
        events = events.filter(created_at__gte=datetime.combine(cleaned["since"], time.min, tzinfo=zone))
    if cleaned.get("until"):  # inclusive: everything before the next day starts
        next_day = datetime.combine(cleaned["until"] + timedelta(days=1), time.min, tzinfo=zone)
        events = events.filter(created_at__lt=next_day)
    # A stable order: events of the same instant keep their place between pages.
    return events.order_by("-created_at", "-id")


def _who(event: AuditEvent) -> str:
    person = (event.actor.email or event.actor.username) if event.actor else ""
    if event.actor_key is not None:
        key = f"key {event.actor_key.key_prefix}…"
        return f"{person} via {key}" if person else key
    return person or "system"


def _metadata_summary(metadata: Any) -> tuple[str, int]:
    """`k=v · k=v` for the first keys, and how many more there are."""
    if not isinstance(metadata, dict) or not metadata:
        return "", 0
    parts = []
    for key, value in list(metadata.items())[:METADATA_SHOWN]:
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        parts.append(f"{key}={shown}")
    return " · ".join(parts), max(0, len(metadata) - METADATA_SHOWN)


def _row(event: AuditEvent, people: dict[str, str]) -> dict[str, Any]:
    summary, more = _metadata_summary(event.metadata)
    return {"target_name": people.get(event.target_id, "") if event.target_type == "user" else "",
        "when": event.created_at, "who": _who(event), "action": event.action,
        "action_label": readable_action(event.action), "target_type": event.target_type,
        "target_id": event.target_id, "ip": event.ip or "", "metadata": summary, "metadata_more": more,
    }


@dashboard_page(roles=ADMINS)
def audit(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    events = audit_events_visible_to(principal)
    actions = sorted(events.order_by().values_list("action", flat=True).distinct())
    members = list(members_visible_to(principal).order_by("user__email"))
    actors = [(m.user_id, m.user.email or m.user.username) for m in members]
    # Events name people by public id; show the member's email beside it (no query per row).
    people = {m.user.public_id: m.user.email for m in members if m.user.email}
    form = AuditFilterForm(request.GET or None, actions=actions, actors=actors)
    if request.GET and not form.is_valid():
        return render(request, "dashboard/audit/audit.html",
                      {"form": form, "page": None, "rows": [], "query": ""}, status=400)
    cleaned = form.cleaned_data if request.GET else {}
    filtered = _filtered(events, cleaned)
    query = request.GET.copy()
    query.pop("page", None)
    query.pop("format", None)
    if request.GET.get("format") == "csv":
        return _csv(filtered)
    page = Paginator(filtered, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "dashboard/audit/audit.html", {
        "form": form, "page": page, "rows": [_row(e, people) for e in page.object_list],
        "query": query.urlencode(), "filtered": any(cleaned.get(name) not in (None, "") for name in form.fields),
    })


class _Echo:
    """A file-like object whose write returns the line, for csv.writer inside a stream."""

    def write(self, value: str) -> str:
        return value


def _csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # A spreadsheet would run a cell starting with one of these as a formula (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv(events: QuerySet[AuditEvent]) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(["when (UTC)", "who", "action", "target type", "target", "ip", "metadata"])
        for event in events[:CSV_MAX_ROWS].iterator(chunk_size=2000):
            yield writer.writerow([_csv_cell(v) for v in (
                event.created_at.astimezone(UTC).isoformat(),
                _who(event), event.action, event.target_type, event.target_id, event.ip,
                json.dumps(event.metadata, ensure_ascii=False, sort_keys=True, default=str))])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
    return response
