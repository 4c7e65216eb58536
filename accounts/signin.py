"""What a password sign-in costs, on every page that takes one: the dashboard's `/login/` and the
Django admin's `/admin/login/` (docs/operations.md §5).

Failed sign-ins count per account name and per client IP (accounts/throttles.py FailureLimit);
10 for one account (or 30 from one IP) within 15 minutes lock it for 15 minutes, doubling on a
repeat within a day. Both pages keep ONE state: failures on either count together, and an account
or address locked on one is locked on the other. WHY: the admin's staff reach every school, so
its sign-in must not be the unthrottled door around the dashboard's lockout. A locked sign-in is
refused even with the right password (the password is not even checked), and every attempt on an
existing account is audited (`login.succeeded`, `login.failed`, `login.locked`; `via` names the page).

`LockoutFormMixin` puts this into Django's AuthenticationForm (the extension point both login views
take, `authentication_form` / `AdminSite.login_form`); `locked_response` gives the view's answer its
429 and Retry-After.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpResponse

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


def sign_in_blocked_for(*, ip: str, username: Any) -> float | None:
    """Seconds until a sign-in as `username` (the name as sent) from `ip` may be tried, or None."""
    account = _account(username)
    waits = [LOGIN_IP_FAILURES.blocked_for(ip), LOGIN_ACCOUNT_FAILURES.blocked_for(account) if account else None]
    return max((wait for wait in waits if wait is not None), default=None)


def sign_in_failed(*, ip: str, username: Any, user: User | None, via: str) -> float | None:
    """Count a failed sign-in against the account name and the IP and audit it on `user` (the
    existing account the name names, if any: unknown names are not stored). Returns the lock's
    length in seconds when this failure starts one."""
    account = _account(username)
    locks = [LOGIN_IP_FAILURES.record(ip), LOGIN_ACCOUNT_FAILURES.record(account) if account else None]
    lock = max((seconds for seconds in locks if seconds is not None), default=None)
    if user is not None:
        login_record(user=user, ip=ip, succeeded=False, via=via,
                     locked_for_seconds=int(lock) if lock is not None else None)
    return lock


def sign_in_succeeded(*, ip: str, username: Any, user: User, via: str) -> None:
    """Forget the account's failures in the current window and audit the sign-in."""
    account = _account(username)
    if account:
        LOGIN_ACCOUNT_FAILURES.clear(account)
    login_record(user=user, ip=ip, succeeded=True, via=via)


def locked_message(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return (f"Too many failed sign-in attempts. Signing in is locked for {minutes} minute"
            f"{'s' if minutes != 1 else ''}; try again later or ask a school admin.")


class LockoutFormMixin:
    """For an AuthenticationForm (given the request, as both login views do): checks the lock
    before the password, counts every refused attempt (a wrong password, a name or password the
    fields refuse, the admin's "not staff") and audits it. `locked_for` is set when the form
    was refused because the sign-in is locked."""

    via = "password"  # the audit's name for the page
    locked_for: float | None = None

    def clean(self) -> dict[str, Any]:
        form: Any = self  # an AuthenticationForm: request, data, cleaned_data, get_user
        ip = client_ip(form.request)
        username = form.data.get("username")  # as sent, like the throttle key of /login/ always was
        wait = sign_in_blocked_for(ip=ip, username=username)
        if wait is not None:
            raise self._locked(wait)
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except ValidationError:
            self._failed(ip, username)
            raise
        user = form.get_user()
        if user is None:  # a field refused its value (AuthenticationForm.clean then checks nothing)
            self._failed(ip, username)
        else:
            sign_in_succeeded(ip=ip, username=username, user=user, via=self.via)
        return cleaned

    def _failed(self, ip: str, username: Any) -> None:
        # cleaned_data, not raw data, to find the account: the field validators refused NUL bytes and such.
        name = self.cleaned_data.get("username")  # type: ignore[attr-defined]
        user = User.objects.filter(username=name).first() if isinstance(name, str) and name else None
        lock = sign_in_failed(ip=ip, username=username, user=user, via=self.via)
        if lock is not None:
            raise self._locked(lock) from None

    def _locked(self, seconds: float) -> ValidationError:
        self.locked_for = seconds
        return ValidationError(locked_message(seconds), code="locked")

    @property
    def locked_message(self) -> str | None:
        return locked_message(self.locked_for) if self.locked_for is not None else None


class LockoutAuthenticationForm(LockoutFormMixin, AuthenticationForm):
    """The dashboard's sign-in form (accounts/views.py LoginView)."""


def locked_response(response: HttpResponse, form: Any) -> HttpResponse:
    """`response` (the sign-in page shown again) as a 429 with Retry-After when `form` was refused
    because the sign-in is locked; unchanged otherwise."""
    seconds = getattr(form, "locked_for", None)
    if seconds is not None:
        response.status_code = 429
        response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response
