"""OpenAPI descriptions of our authentication classes (drf-spectacular extensions).

Imported from AccountsConfig.ready so the schema names the credentials every endpoint accepts.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
