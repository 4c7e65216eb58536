"""The OpenAPI schema is generated and validated: every endpoint documented, no warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_manage


def test_openapi_schema_generates_and_validates_without_warnings(tmp_path: Path) -> None:
    target = tmp_path / "schema.yaml"
    result = run_manage("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    assert result.returncode == 0, result.stderr[-4000:]
    assert target.read_text().startswith("openapi: 3")


@pytest.mark.django_db
def test_the_public_document_is_generated_once_per_process(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/api/schema/` needs no credential and no rate limit applies to it: a second request must not
    pay for generating the document again (memoryhub.views.OnceGeneratedSchema)."""
    from drf_spectacular.generators import SchemaGenerator

    from memoryhub.views import OnceGeneratedSchema

    generated: list[bool] = []
    real = SchemaGenerator.get_schema

    def counting(self: SchemaGenerator, request: Any = None, public: bool = False) -> Any:
        generated.append(public)
        return real(self, request=request, public=public)

    monkeypatch.setattr(SchemaGenerator, "get_schema", counting)
    monkeypatch.setattr(OnceGeneratedSchema, "_documents", {})
    first = client.get("/api/schema/?format=json")
    second = client.get("/api/schema/?format=json")
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and generated == [True]


@pytest.mark.django_db
def test_a_strangers_language_neither_regenerates_the_document_nor_keeps_another(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from memoryhub.views import OnceGeneratedSchema

    monkeypatch.setattr(OnceGeneratedSchema, "_documents", {})
    for lang in ("en-us", "xx-hostile", "zz", "\u202e"):
        assert client.get("/api/schema/", {"format": "json", "lang": lang}).status_code == 200
    assert len(OnceGeneratedSchema._documents) == 1
