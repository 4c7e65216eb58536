"""The API documentation says what the API does: every operation summarised, one request schema per
memory kind generated from the schema that validates it, and examples that work when sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

from memories.models import Memory
from memories.records.fields import kind_fields
from memories.records.vocabulary import KINDS
from tests.actors import School

MEMORIES = "/api/v1/stacks/{stack}/memories"


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document, renderer_context={}))


def _operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, operation) for path, item in openapi["paths"].items()
            for method, operation in item.items() if isinstance(operation, dict)]


def _component(openapi: dict[str, Any], ref: dict[str, str]) -> dict[str, Any]:
    return openapi["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]


def _body_schema(openapi: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    content = openapi["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]
    return _component(openapi, content["schema"])


def _examples(openapi: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    content = openapi["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]
    return {name: example["value"] for name, example in content.get("examples", {}).items()}


def test_every_operation_has_a_summary(openapi: dict[str, Any]) -> None:
    missing = [f"{method} {path}" for method, path, operation in _operations(openapi)
               if not (operation.get("summary") or "").strip()]
    assert missing == []


def test_the_create_body_is_one_schema_per_kind_from_the_memory_schema(openapi: dict[str, Any]) -> None:
    body = _body_schema(openapi, "POST", MEMORIES)
    assert body["discriminator"]["propertyName"] == "kind"
    assert set(body["discriminator"]["mapping"]) == set(KINDS)
    assert len(body["oneOf"]) == len(KINDS)
    for kind, ref in body["discriminator"]["mapping"].items():
        schema = _component(openapi, {"$ref": ref})
        fields = kind_fields(kind)
        assert set(schema["properties"]) == fields.names | {"kind", "record_id", "extra"}, kind
        assert set(schema["required"]) == {"kind"} | {spec.name for spec in fields.fields if spec.required}
        assert schema["additionalProperties"] is False  # an unknown field is a 400
        assert _component(openapi, schema["properties"]["kind"])["enum"] == [kind]
    goal = _component(openapi, {"$ref": body["discriminator"]["mapping"]["goal"]})
    assert goal["properties"]["title"]["maxLength"] == 2000 and goal["properties"]["title"]["minLength"] == 1
    assert {"type": "string", "enum": ["low", "medium", "high", "urgent", "critical"]} in \
        goal["properties"]["priority"]["oneOf"]
    raw = _component(openapi, {"$ref": body["discriminator"]["mapping"]["raw"]})
    assert raw["allOf"] == [{"anyOf": [{"required": ["content"]}, {"required": ["blob"]}]}]


def test_batch_update_and_ingest_bodies_are_documented_per_kind(openapi: dict[str, Any]) -> None:
    create = _body_schema(openapi, "POST", MEMORIES)
    batch = _body_schema(openapi, "POST", MEMORIES + "/batch")
    assert batch["properties"]["items"]["items"]["oneOf"] == create["oneOf"]
    update = _body_schema(openapi, "PATCH", MEMORIES + "/{memory_id}")
    assert len(update["anyOf"]) == len(KINDS)
    for ref in update["anyOf"]:
        schema = _component(openapi, ref)
        assert "kind" not in schema["properties"] and "required" not in schema
    ingest = _body_schema(openapi, "POST", "/api/v1/stacks/{stack}/ingest")
    assert set(ingest["discriminator"]["mapping"]) == set(KINDS)
    belief = _component(openapi, {"$ref": ingest["discriminator"]["mapping"]["belief"]})
    assert {"force_create", "supersedes", "thresholds", "statement"} <= set(belief["properties"])
    assert belief["properties"]["supersedes"]["format"] == "uuid"  # the ingest option wins over the belief field
    assert "data" not in belief["properties"] and "deprecated" in ingest["description"].lower()


@pytest.mark.django_db
def test_the_request_examples_work_when_sent(openapi: dict[str, Any], school: School) -> None:
    def send(method: str, path: str, expected: int, replace: dict[str, str] | None = None) -> None:
        examples = _examples(openapi, method, path)
        assert examples, f"no example for {method} {path}"
        for name, body in examples.items():
            text = json.dumps(body)
            for old, new in (replace or {}).items():
                text = text.replace(old, new)
            url = path.replace("{stack}", "alice")
            response = school.agent.generic(method, url, text, content_type="application/json")
            assert response.status_code == expected, (name, response.content)

    send("POST", MEMORIES, 201)
    send("POST", MEMORIES + "/batch", 201)
    belief = Memory.objects.filter(stack=school.stack, kind="belief").first()
    assert belief is not None
    send("POST", "/api/v1/stacks/{stack}/ingest", 201,
         {"5b0c1f4e-8a51-4c43-9a55-2f1c3f0b6a11": str(belief.pk)})
    send("POST", "/api/v1/stacks/{stack}/search", 200)
    send("POST", "/api/v1/stacks/{stack}/sync/push", 200)
    send("POST", "/sync/push", 200, {'"stack_id": "ada"': '"stack_id": "alice"'})


@pytest.mark.django_db
def test_the_load_example_has_the_shape_load_answers(openapi: dict[str, Any], school: School) -> None:
    school.agent.post(MEMORIES.replace("{stack}", "alice"),
                      {"kind": "value", "name": "curiosity", "statement": "Ask why before how"}, format="json")
    school.agent.put("/api/v1/stacks/alice/boot-config/tone", {"value": "encouraging"}, format="json")
    answer = school.agent.get("/api/v1/stacks/alice/load").json()
    content = openapi["paths"]["/api/v1/stacks/{stack}/load"]["get"]["responses"]["200"]["content"]
    example = next(iter(content["application/json"]["examples"].values()))["value"]

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: shape(item) for key, item in value.items()}
        if isinstance(value, list):
            return [shape(value[0])] if value else []
        return type(value).__name__

    assert shape(example) == shape(answer)
