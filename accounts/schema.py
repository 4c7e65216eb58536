"""OpenAPI descriptions of our authentication: the credentials every endpoint accepts
(drf-spectacular extensions, imported from AccountsConfig.ready) and the error responses that
authentication and throttling can give on any endpoint (`ERRORS`, which the api modules of every
app spread into their `responses`, with the common 403 and 404; they live here so that no api
module imports another).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse

ERRORS = {400: OpenApiResponse(description="Invalid input; `detail` says why"),
          401: OpenApiResponse(description="Missing, invalid, revoked or expired credential"),
          429: OpenApiResponse(description="Rate limited; see Retry-After"),
          503: OpenApiResponse(description="Auth or throttle state unavailable; see Retry-After")}
FORBIDDEN = {403: OpenApiResponse(description="Not allowed for this role or credential")}
NOT_VISIBLE = {404: OpenApiResponse(description="Not visible to the caller")}


class BearerAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.BearerAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A `knl_sk_` API key, or a JWT access token from /auth/register or /auth/login.",
        }


class SessionPrincipalAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.SessionPrincipalAuthentication"
    name = "sessionAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid",
                "description": "Dashboard session; unsafe methods also need the CSRF token (X-CSRFToken)."}
