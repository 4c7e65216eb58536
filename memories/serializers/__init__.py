"""DRF serializers of the memories API: the request serializers are both the validation and the
OpenAPI schema of every body and query string (`@extend_schema(request=…, parameters=[…])`); the
response serializers render and document what comes back.

Two things are deliberately not parsed here:

* the values of a memory record's fields (a belief's `statement`, a goal's `priority`, …): every
  memory write — this API, batch, smart ingest and kernle sync — checks them with the one per-kind
  schema, `memories.records.normalize.normalize_memory`, in the service. A body that carries a record
  (`MemoryRecordSerializer`) checks its envelope here, refuses keys the kind does not have
  (`memories.records.fields.native_record`: a 400 `unknown_field` with the closest known field; fields a
  kind does not model go under `extra`) and hands the record on. Kernle sync does not come
  through here and keeps unknown fields (docs/kernle-protocol.md §3.7). The OpenAPI document of
  these bodies — one schema per memory kind — is generated from the same field list
  (`MemoryRecordSchemaExtension`);
* the sync push operations (memories.api.sync): see that module for why.

Rules (who may do what, which stack) live in selectors and services, never here.

The package, by seam: `fields` (the strict input fields the request serializers are built from),
`records` (the bodies that carry a memory record, and their OpenAPI extensions), `openapi` (the
per-kind schemas those extensions register), `memories` (memories, checkpoints, boot config, load,
promotion) and `search` (search, smart ingest, retrieval feedback). `validated`, below, is how a
view runs any of them. They cannot live under `api/`: nothing may import an entry point
(pyproject.toml's `entry-points` contract), and the MCP tools (agents) use them too.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


def validated(serializer_class: type[serializers.Serializer], data: Any,
              context: dict[str, Any] | None = None) -> dict[str, Any]:
    """`data` checked by `serializer_class`; a ValidationError becomes the API's 400 with field errors
    (memoryhub.errors). A body that is not a JSON object is refused the same way
    (`non_field_errors`)."""
    serializer = serializer_class(data=data, context=context or {})
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
