"""The Content-Security-Policy header of every response (settings.CONTENT_SECURITY_POLICY).

django-csp's middleware builds the header anew for each response, to allow per-request nonces and
per-view changes; this service uses neither (no inline script or style anywhere, no view changes
the policy), so the header is built once, by django-csp's own builder from the same setting, and
set on every response that does not carry one (docs/benchmarks.md "Figures behind code choices").
A page that ever needs a nonce or a per-view policy: put `csp.middleware.CSPMiddleware` back in
settings.MIDDLEWARE in place of this one.
"""

from __future__ import annotations

from collections.abc import Callable

from csp.constants import HEADER
from csp.utils import build_policy
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

# Django's debug pages for these (DEBUG only) style themselves inline: left without the header, as
# django-csp leaves them.
_DEBUG_PAGES = frozenset({404, 500})


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.header = build_policy()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if settings.DEBUG and response.status_code in _DEBUG_PAGES:
            return response
        if self.header and HEADER not in response:
            response[HEADER] = self.header
        return response
