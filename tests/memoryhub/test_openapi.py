"""The OpenAPI schema is generated and validated: every endpoint documented, no warnings."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_manage


def test_openapi_schema_generates_and_validates_without_warnings(tmp_path: Path) -> None:
    target = tmp_path / "schema.yaml"
    result = run_manage("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    assert result.returncode == 0, result.stderr[-4000:]
    assert target.read_text().startswith("openapi: 3")
