"""Dashboard sign-in and sign-out: Django sessions with CSRF; every attempt is audited.

Guessing passwords costs (accounts/throttles.py FailureLimit): failed sign-ins count per account
name and per client IP; 10 for one account (or 30 from one IP) within 15 minutes lock it for 15
minutes, doubling on a repeat within a day. A locked sign-in is refused with 429 and a message
saying so — even with the right password — and the lock of an existing account is audited.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse

from accounts.models import User
from accounts.network import client_ip
from accounts.services import login_record
from accounts.throttles import LOGIN_ACCOUNT_FAILURES, LOGIN_IP_FAILURES


def _account(username: Any) -> str | None:
    """The throttle identity of a sign-in name: case-folded (the name is an email) and hashed, so
    any text the form was sent makes a safe Redis key and none is kept in Redis."""
    if not isinstance(username, str) or not username.strip():
        return None
    return hashlib.sha256(username.strip().lower()[:254].encode()).hexdigest()[:32]


def _locked_message(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return (f"Too many failed sign-in attempts. Signing in is locked for {minutes} minute"
            f"{'s' if minutes != 1 else ''}; try again later or ask a school admin.")


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    next_page = "/dashboard/"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        account = _account(request.POST.get("username"))
        waits = [LOGIN_IP_FAILURES.blocked_for(client_ip(request)),
                 LOGIN_ACCOUNT_FAILURES.blocked_for(account) if account else None]
        wait = max((w for w in waits if w is not None), default=None)
        if wait is not None:
            return self._locked(self.get_form_class()(request), wait)
        return super().post(request, *args, **kwargs)

    def _locked(self, form: AuthenticationForm, seconds: float) -> HttpResponse:
        response = self.render_to_response(self.get_context_data(form=form, locked_message=_locked_message(seconds)),
                                           status=429)
        response["Retry-After"] = str(max(1, math.ceil(seconds)))
        return response

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        user = form.get_user()
        account = _account(self.request.POST.get("username"))
        if account:
            LOGIN_ACCOUNT_FAILURES.clear(account)
        login_record(user=user, ip=client_ip(self.request), succeeded=True, via="password")
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        ip = client_ip(self.request)
        account = _account(self.request.POST.get("username"))
        locks = [LOGIN_IP_FAILURES.record(ip), LOGIN_ACCOUNT_FAILURES.record(account) if account else None]
        # cleaned_data, not raw data: the field validators already refused NUL bytes and such.
        username = form.cleaned_data.get("username")
        # Only an existing account gets a failure event; unknown names are not stored.
        user = User.objects.filter(username=username).first() if isinstance(username, str) and username else None
        lock = max((seconds for seconds in locks if seconds is not None), default=None)
        if user is not None:
            login_record(user=user, ip=ip, succeeded=False, via="password",
                         locked_for_seconds=int(lock) if lock is not None else None)
        if lock is not None:
            return self._locked(form, lock)
        return super().form_invalid(form)

    def get_default_redirect_url(self) -> str:
        return "/dashboard/"


class LogoutView(auth_views.LogoutView):
    next_page = "/login/"
