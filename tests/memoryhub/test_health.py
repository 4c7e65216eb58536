"""Liveness, readiness and the one error contract."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from memoryhub.embedded import EmbeddedRedis, free_port


def test_health_is_200_without_auth(client: Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db(transaction=True)
def test_readyz_names_every_part_ok_when_all_answer(client: Client, celery_worker: object) -> None:
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["failing"] == []
    assert set(body["checks"]) == {"database", "redis", "celery"}
    assert body["checks"]["database"]["detail"].startswith("ok (pgvector ")
    assert all(check["ok"] for check in body["checks"].values())


@pytest.mark.django_db
def test_killing_redis_turns_readyz_503_naming_redis_while_health_stays_200(client: Client, tmp_path) -> None:
    own_redis = EmbeddedRedis(tmp_path / "redis", free_port())
    own_redis.prepare()
    own_redis.start()
    try:
        with override_settings(REDIS_URL=own_redis.url()):
            assert client.get("/readyz").json()["checks"]["redis"]["ok"] is True
            own_redis.process.stop()  # SIGTERM to the real redis-server process
            response = client.get("/readyz")
            assert response.status_code == 503
            assert response["Retry-After"] == "5"
            body = response.json()
            assert "redis" in body["failing"]
            assert body["checks"]["redis"]["ok"] is False
            assert body["checks"]["celery"]["ok"] is False  # no broker, no worker reachable
            assert client.get("/health").status_code == 200
    finally:
        own_redis.stop()


def test_unknown_api_path_is_json_404(client: Client) -> None:
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_found"


def test_openapi_schema_and_docs_are_served(client: Client) -> None:
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    assert schema.json()["info"]["title"] == "MemoryHub API"
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


@pytest.mark.django_db
def test_nul_byte_reaching_the_database_is_a_400_not_a_500() -> None:
    from django.db import DataError
    from rest_framework.test import APIRequestFactory

    from memoryhub.errors import api_exception_handler

    request = APIRequestFactory().get("/")
    try:
        from accounts.models import Organization

        Organization.objects.filter(slug="bad\x00slug").exists()
    except DataError as exc:
        response = api_exception_handler(exc, {"request": request})
    else:  # pragma: no cover - psycopg always refuses NUL in text
        raise AssertionError("psycopg accepted a NUL byte")
    assert response.status_code == 400
    assert response.data["error"]["code"] == "invalid"
