"""The public ids docs/privacy.md names for the entity ids of `access_grants` (`human:<user id>`,
`key:<key id>`, `webhook:<endpoint id>`, `org:<school id>`) are the ids the code makes: a school
that writes `webhook:whe_…` into a grant, as the page once said, grants nothing, because endpoints
are `whk_…`. Each prefix is read from the page and compared with a fresh id from the model field's
own default, so renaming either side without the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accounts.models import ApiKey, Organization, User
from webhooks.models import WebhookEndpoint

PRIVACY = Path(__file__).resolve().parents[1] / "docs" / "privacy.md"


def documented_prefix(placeholder: str) -> str:
    """The `xxx_…` the page gives for `<placeholder>`: the first one written after it."""
    text = PRIVACY.read_text()
    marker = f"`<{placeholder}>`"
    assert marker in text, f"docs/privacy.md no longer explains {marker}"
    found = re.search(r"`([a-z]+_)…`", text[text.index(marker):])
    assert found is not None, f"docs/privacy.md gives no id prefix for {marker}"
    return found.group(1)


# Each id's maker: the model field's own default (what a new row gets).
ID_DEFAULTS = {
    "user id": User._meta.get_field("public_id").default,
    "key id": ApiKey._meta.get_field("public_id").default,
    "endpoint id": WebhookEndpoint._meta.get_field("public_id").default,
    "school id": Organization._meta.get_field("public_id").default,
}


def generated_prefix(placeholder: str) -> str:
    return str(ID_DEFAULTS[placeholder]()).split("_", 1)[0] + "_"


@pytest.mark.parametrize("placeholder", list(ID_DEFAULTS))
def test_the_id_prefixes_in_the_privacy_page_are_the_generated_ones(placeholder: str) -> None:
    assert documented_prefix(placeholder) == generated_prefix(placeholder)
