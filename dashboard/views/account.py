"""The signed-in person's account: password change; and Django's password-reset flow for people
who cannot sign in (/password-reset/…, emailed through settings.EMAIL_BACKEND — the console unless
EMAIL_HOST is set).

Both changes are audited (`password.changed`, with `via`). Changing or resetting a password ends
the person's other sessions (Django's session hash follows the password); the change keeps the
current one (update_session_auth_hash, done by PasswordChangeView).

Reset requests cost (accounts.throttles.FailureLimit, as failed sign-ins do): a few per email
address and some more per client IP per hour, then that address or IP waits — so the form cannot
be used to flood someone's mailbox. The answer never says whether an account exists.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.http import HttpRequest, HttpResponse
from django.urls import reverse_lazy

from accounts.network import client_ip
from accounts.principal import Principal
from accounts.services import password_changed_record
from accounts.throttles import FailureLimit
from dashboard.access import BILLING_PAGES, GUARDIANS, STAFF, dashboard_page

CONFIRM_LABEL = "Confirm password"


class _PasswordChangeForm(PasswordChangeForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["new_password2"].label = CONFIRM_LABEL


class _SetPasswordForm(SetPasswordForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["new_password2"].label = CONFIRM_LABEL


class _PasswordChange(auth_views.PasswordChangeView):
    template_name = "dashboard/account/password_change.html"
    form_class = _PasswordChangeForm
    success_url = reverse_lazy("dashboard:password-change")

    def form_valid(self, form: PasswordChangeForm) -> HttpResponse:
        response = super().form_valid(form)
        password_changed_record(user=form.user, ip=client_ip(self.request), via="change")
        messages.success(self.request, "Your password was changed. Your other sessions were signed out.")
        return response

    def form_invalid(self, form: PasswordChangeForm) -> HttpResponse:
        return self.render_to_response(self.get_context_data(form=form), status=400)


@dashboard_page(roles=STAFF | BILLING_PAGES | GUARDIANS)
def password_change(request: HttpRequest, principal: Principal) -> HttpResponse:
    response = _PasswordChange.as_view()(request)
    assert isinstance(response, HttpResponse)  # a page or a redirect
    return response


# --- password reset -------------------------------------------------------------------------


@dataclass(frozen=True)
class _RequestLimit(FailureLimit):
    """A FailureLimit counting every reset request (not failures) at a fixed rate: (requests,
    window seconds, first block seconds)."""

    limits: tuple[int, int, int] = (3, 3600, 3600)

    def rate(self) -> tuple[int, int, int]:
        return self.limits


RESET_EMAIL_REQUESTS = _RequestLimit("password_reset_email", limits=(3, 3600, 3600))
RESET_IP_REQUESTS = _RequestLimit("password_reset_ip", limits=(10, 3600, 3600))


def _email_identity(email: Any) -> str | None:
    # Hashed and case-folded, as for sign-in names: any text makes a safe Redis key; none is kept.
    if not isinstance(email, str) or not email.strip():
        return None
    return hashlib.sha256(email.strip().lower()[:254].encode()).hexdigest()[:32]


class PasswordReset(auth_views.PasswordResetView):
    template_name = "registration/password_reset_form.html"
    email_template_name = "registration/password_reset_email.txt"
    subject_template_name = "registration/password_reset_subject.txt"
    success_url = reverse_lazy("dashboard:password-reset-done")

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        ip = client_ip(request)
        email = _email_identity(request.POST.get("email"))
        waits = [RESET_IP_REQUESTS.blocked_for(ip), RESET_EMAIL_REQUESTS.blocked_for(email) if email else None]
        wait = max((w for w in waits if w is not None), default=None)
        if wait is not None:
            minutes = max(1, math.ceil(wait / 60))
            response = self.render_to_response(self.get_context_data(
                form=self.get_form(), limited_message=(
                    f"Too many password reset requests. Try again in {minutes} minute{'s' if minutes != 1 else ''}; "
                    "if an email is on its way, use the link in it.")), status=429)
            response["Retry-After"] = str(max(1, math.ceil(wait)))
            return response
        RESET_IP_REQUESTS.record(ip)
        if email:
            RESET_EMAIL_REQUESTS.record(email)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        return self.render_to_response(self.get_context_data(form=form), status=400)


class PasswordResetSent(auth_views.PasswordResetDoneView):
    template_name = "registration/password_reset_done.html"


class PasswordResetConfirm(auth_views.PasswordResetConfirmView):
    template_name = "registration/password_reset_confirm.html"
    form_class = _SetPasswordForm
    success_url = reverse_lazy("dashboard:password-reset-complete")

    def form_valid(self, form: SetPasswordForm) -> HttpResponse:
        response = super().form_valid(form)
        password_changed_record(user=form.user, ip=client_ip(self.request), via="reset")
        return response

    def form_invalid(self, form: SetPasswordForm) -> HttpResponse:
        return self.render_to_response(self.get_context_data(form=form), status=400)


class PasswordResetComplete(auth_views.PasswordResetCompleteView):
    template_name = "registration/password_reset_complete.html"
