"""Dashboard sign-in and sign-out: Django sessions with CSRF; every attempt is audited."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse

from accounts.models import User
from accounts.network import client_ip
from accounts.services import login_record


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    next_page = "/dashboard/"

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        user = form.get_user()
        login_record(user=user, ip=client_ip(self.request), succeeded=True, via="password")
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        # cleaned_data, not raw data: the field validators already refused NUL bytes and such.
        username = form.cleaned_data.get("username")
        # Only an existing account gets a failure event; unknown names are not stored.
        user = User.objects.filter(username=username).first() if isinstance(username, str) and username else None
        if user is not None:
            login_record(user=user, ip=client_ip(self.request), succeeded=False, via="password")
        return super().form_invalid(form)

    def get_default_redirect_url(self) -> str:
        return "/dashboard/"


class LogoutView(auth_views.LogoutView):
    next_page = "/login/"
