"""Dashboard: the school's webhook endpoints — register, switch off and on, delete, rotate the
signing secret, send a test event, and read each endpoint's delivery log.

For school admins only (any other role gets a 404). Which endpoints a caller reaches is
webhooks.selectors (their own school's; another school's id is a 404); every change is one of
webhooks.services' audited calls. A signing secret is shown once, in the answer to the POST that
made it (create, rotate), on a no-store page — never through a redirect, the session or a log.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from accounts.principal import Principal
from dashboard.access import ADMINS, dashboard_page, request_ip
from webhooks.event_types import EVENT_TYPES
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.selectors import deliveries_of, endpoint_for_principal, endpoints_visible_to, last_deliveries
from webhooks.services import (
    endpoint_create,
    endpoint_delete,
    endpoint_disable,
    endpoint_enable,
    endpoint_secret_rotate,
    endpoint_test_send,
)
from webhooks.targets import TargetRefused, target_checked

DELIVERIES_PER_PAGE = 50
STATUS_CHOICES = [("", "Any status"), *WebhookDelivery.Status.choices]


class EndpointForm(forms.Form):
    url = forms.CharField(label="Endpoint URL", max_length=2000,
                          widget=forms.URLInput(attrs={"placeholder": "https://example.org/memoryhub/webhook"}),
                          help_text="Must be https:// and reachable from the internet.")
    description = forms.CharField(label="Description", max_length=200, required=False,
                                  help_text="Optional: what receives these events.")
    event_types = forms.MultipleChoiceField(label="Events to send", choices=EVENT_TYPES,
                                            widget=forms.CheckboxSelectMultiple, initial=["*"])
    include_text = forms.BooleanField(label="Include memory text in deliveries", required=False,
                                      help_text="Off: deliveries carry memory ids and kinds only.")

    def clean_url(self) -> str:
        try:
            return target_checked(self.cleaned_data["url"]).url
        except TargetRefused as refused:
            raise forms.ValidationError(str(refused)) from None


class DeliveryFilterForm(forms.Form):
    status = forms.ChoiceField(label="Status", choices=STATUS_CHOICES, required=False,
                               widget=forms.Select(attrs={"data-autosubmit": ""}))


def _status(endpoint: WebhookEndpoint) -> str:
    if endpoint.enabled:
        return "failing" if endpoint.failing_since is not None else "active"
    return "disabled (failing)" if endpoint.needs_attention else "disabled"


def _index(request: HttpRequest, principal: Principal, *, form: EndpointForm | None = None,
           shown: WebhookEndpoint | None = None, secret: str = "", rotated: bool = False,
           status: int = 200) -> HttpResponse:
    endpoints = list(endpoints_visible_to(principal).order_by("-created_at", "-pk"))
    latest = last_deliveries(endpoints)
    rows = [(endpoint, _status(endpoint), latest.get(endpoint.pk)) for endpoint in endpoints]
    response = render(request, "dashboard/webhooks/index.html", {
        "form": form or EndpointForm(), "rows": rows, "shown": shown, "secret": secret, "rotated": rotated,
        "attention": [endpoint for endpoint in endpoints if endpoint.needs_attention],
    }, status=status)
    # The answer that shows a secret must not be kept by a cache or the history; nor the list.
    add_never_cache_headers(response)
    return response


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest, principal: Principal) -> HttpResponse:
    if request.method != "POST":
        return _index(request, principal)
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _index(request, principal, form=form, status=400)
    endpoint, secret = endpoint_create(
        organization=principal.organization, url=form.cleaned_data["url"],
        event_types=form.cleaned_data["event_types"], include_text=form.cleaned_data["include_text"],
        description=form.cleaned_data["description"], principal=principal, ip=request_ip(request))
    return _index(request, principal, shown=endpoint, secret=secret, status=201)


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET"])
def webhook_detail(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_for_principal(principal, endpoint_id)
    filters = DeliveryFilterForm(request.GET)
    chosen = filters.cleaned_data["status"] if filters.is_valid() else ""
    page = Paginator(deliveries_of(endpoint, status=chosen), DELIVERIES_PER_PAGE).get_page(request.GET.get("page"))
    context: dict[str, Any] = {"endpoint": endpoint, "endpoint_status": _status(endpoint), "filters": filters,
                               "page": page, "chosen": chosen}
    return render(request, "dashboard/webhooks/detail.html", context, status=200 if filters.is_valid() else 400)


@dashboard_page(roles=ADMINS)
@require_POST
def webhook_disable(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_disable(endpoint=endpoint_for_principal(principal, endpoint_id), principal=principal,
                                ip=request_ip(request))
    messages.success(request, f"Webhook {endpoint.url} is disabled; no events are sent to it.")
    return redirect("dashboard:webhooks")


@dashboard_page(roles=ADMINS)
@require_POST
def webhook_enable(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_enable(endpoint=endpoint_for_principal(principal, endpoint_id), principal=principal,
                               ip=request_ip(request))
    messages.success(request, f"Webhook {endpoint.url} is enabled again.")
    return redirect("dashboard:webhooks")


@dashboard_page(roles=ADMINS)
@require_POST
def webhook_delete(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_for_principal(principal, endpoint_id)
    url = endpoint.url
    endpoint_delete(endpoint=endpoint, principal=principal, ip=request_ip(request))
    messages.success(request, f"Webhook {url} was deleted with its delivery log.")
    return redirect("dashboard:webhooks")


@dashboard_page(roles=ADMINS)
@require_POST
def webhook_rotate(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_for_principal(principal, endpoint_id)
    secret = endpoint_secret_rotate(endpoint=endpoint, principal=principal, ip=request_ip(request))
    return _index(request, principal, shown=endpoint, secret=secret, rotated=True)


@dashboard_page(roles=ADMINS)
@require_POST
def webhook_test(request: HttpRequest, principal: Principal, endpoint_id: str) -> HttpResponse:
    endpoint = endpoint_for_principal(principal, endpoint_id)
    endpoint_test_send(endpoint=endpoint, principal=principal, ip=request_ip(request))
    messages.success(request, "A test event is on its way; its delivery shows in the log below.")
    return redirect("dashboard:webhook", endpoint_id=endpoint.public_id)
