"""Dashboard sign-in and sign-out: Django sessions with CSRF; every attempt is audited.

Guessing passwords costs (accounts/signin.py, shared with the Django admin's sign-in): failed
sign-ins count per account name and per client IP; 10 for one account (or 30 from one IP) within
15 minutes lock it for 15 minutes, doubling on a repeat within a day. A locked sign-in is refused
with 429 and a message saying so — even with the right password — and the lock of an existing
account is audited.
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpResponse

from accounts.signin import LockoutAuthenticationForm, locked_response


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    authentication_form = LockoutAuthenticationForm
    redirect_authenticated_user = True
    next_page = "/dashboard/"

    def form_invalid(self, form: LockoutAuthenticationForm) -> HttpResponse:  # type: ignore[override]
        context = self.get_context_data(form=form, locked_message=form.locked_message)
        return locked_response(self.render_to_response(context), form)

    def get_default_redirect_url(self) -> str:
        return "/dashboard/"


class LogoutView(auth_views.LogoutView):
    next_page = "/login/"
