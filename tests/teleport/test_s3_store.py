"""Teleport with an S3-compatible bucket configured (docs/teleport.md §3), against a real S3 HTTP
API: moto's server on a free 127.0.0.1 port, spoken to by boto3 over HTTP exactly as MinIO or AWS
would be. A snapshot goes up and comes back byte-equal; the object holds only ciphertext, under
`teleport/ab/<sha256>`; deleting and purging remove objects; a tampered or missing object is the
same 422 as on disk; an unreachable bucket is a 503 that stores nothing; the data dir stays empty;
and the bucket changes nothing about who may read a snapshot."""

from __future__ import annotations

import gzip
import io
import logging
import socket
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.utils import timezone
from moto.server import ThreadedMotoServer
from pytest_django.fixtures import SettingsWrapper

from stacks.models import Stack
from teleport import services
from teleport.models import Snapshot
from teleport.services import snapshots_purge
from tests.actors import School
from tests.teleport.test_teleport import MARKER, _code, _download, _hostile, _pack, _sibling_agent, _upload, _workspace

pytestmark = pytest.mark.django_db

REGION = "eu-central-1"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API server on a free loopback port, with throwaway credentials in the standard env
    vars (the way a deployment hands them to boto3) and no shared AWS config files read."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "memoryhub-test")
        env.setenv("AWS_SECRET_ACCESS_KEY", "memoryhub-test-secret")
        env.setenv("AWS_CONFIG_FILE", "/nonexistent")
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        env.delenv("AWS_PROFILE", raising=False)
        yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint: str, settings: SettingsWrapper, tmp_path: Path) -> Any:
    """A fresh bucket, configured as the teleport store; the data dir's store is a path that must
    stay absent. Returns a boto3 Bucket to look inside."""
    name = f"teleport-{uuid.uuid4().hex[:16]}"
    resource = boto3.resource("s3", endpoint_url=s3_endpoint, region_name=REGION)
    created = resource.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    settings.TELEPORT_DIR = tmp_path / "store"
    settings.TELEPORT_S3_BUCKET = name
    settings.TELEPORT_S3_ENDPOINT_URL = s3_endpoint
    settings.TELEPORT_S3_REGION = REGION
    return created


def _objects(bucket: Any) -> dict[str, bytes]:
    return {item.key: item.get()["Body"].read() for item in bucket.objects.all()}


def _workspace_upload(school: School, tmp_path: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    source = tmp_path / "workspace"
    source.mkdir()
    files = _workspace(source)
    answer = _upload(school.agent, school, _pack(source), name="in-the-bucket")
    assert answer.status_code == 201, answer.json()
    return files, answer.json()


def _unpacked(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def test_round_trip_through_the_bucket_is_byte_equal(school: School, tmp_path: Path, bucket: Any) -> None:
    files, snapshot = _workspace_upload(school, tmp_path)

    archive = _download(_sibling_agent(school), _code(school, snapshot["id"]))
    assert archive.status_code == 200, archive.content[:200]
    assert _unpacked(archive.content) == files
    owner = school.agent.get(school.stack_url(f"snapshots/{snapshot['id']}/archive"))
    assert owner.status_code == 200 and owner.content == archive.content

    row = Snapshot.objects.get(pk=snapshot["id"])
    objects = _objects(bucket)
    assert list(objects) == [f"teleport/{row.blob_sha256[:2]}/{row.blob_sha256}"]
    assert len(objects[f"teleport/{row.blob_sha256[:2]}/{row.blob_sha256}"]) == row.stored_bytes
    assert not (tmp_path / "store").exists()  # nothing of it in the data dir


def test_the_object_in_the_bucket_is_ciphertext_only(school: School, tmp_path: Path, bucket: Any) -> None:
    _, snapshot = _workspace_upload(school, tmp_path)
    [data] = _objects(bucket).values()
    for plaintext in (MARKER, b"README.md", b"main.py", b"print('hello')", b"two dots inside"):
        assert plaintext not in data
    with pytest.raises(OSError):
        gzip.decompress(data)
    assert len(data) == snapshot["stored_bytes"]


def test_deleting_a_snapshot_removes_its_object(
        school: School, bucket: Any, django_capture_on_commit_callbacks: Any) -> None:
    keep = _upload(school.agent, school, _hostile()).json()
    gone = _upload(school.agent, school, _hostile(content=b"other")).json()
    assert len(_objects(bucket)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert school.agent.delete(school.stack_url(f"snapshots/{gone['id']}")).status_code == 204
    assert [key.rsplit("/", 1)[1] for key in _objects(bucket)] == [Snapshot.objects.get(pk=keep["id"]).blob_sha256]


def test_purge_removes_expired_and_orphan_objects_after_the_grace(
        school: School, bucket: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    keep = _upload(school.agent, school, _hostile()).json()
    expired = _upload(school.agent, school, _hostile(content=b"expired")).json()
    Snapshot.objects.filter(pk=expired["id"]).update(expires_at=timezone.now())
    orphan = "ab" + "1" * 62  # a blob whose row never committed (a failed upload)
    bucket.put_object(Key=f"teleport/ab/{orphan}", Body=b"left by a failed upload")
    bucket.put_object(Key="teleport/readme.txt", Body=b"not a blob: never touched")

    with django_capture_on_commit_callbacks(execute=True):
        counts = snapshots_purge()
    # The orphan was written just now: within the grace it stays (LastModified is what counts).
    assert counts == {"snapshots": 1, "codes": 0, "orphan_blobs": 0}
    keep_key = f"teleport/{Snapshot.objects.get(pk=keep['id']).blob_sha256[:2]}/" \
               f"{Snapshot.objects.get(pk=keep['id']).blob_sha256}"
    assert sorted(_objects(bucket)) == sorted([keep_key, f"teleport/ab/{orphan}", "teleport/readme.txt"])

    monkeypatch.setattr(services, "ORPHAN_GRACE_SECONDS", -60)  # as if an hour had passed
    assert snapshots_purge() == {"snapshots": 0, "codes": 0, "orphan_blobs": 1}
    assert sorted(_objects(bucket)) == sorted([keep_key, "teleport/readme.txt"])
    assert school.agent.get(school.stack_url(f"snapshots/{keep['id']}/archive")).status_code == 200


@pytest.mark.parametrize("damage", ["tampered", "missing"])
def test_a_tampered_or_missing_object_is_a_clear_error(
        school: School, tmp_path: Path, bucket: Any, damage: str) -> None:
    _, snapshot = _workspace_upload(school, tmp_path)
    [item] = bucket.objects.all()
    if damage == "tampered":
        data = bytearray(item.get()["Body"].read())
        data[len(data) // 2] ^= 0x01
        bucket.put_object(Key=item.key, Body=bytes(data))
    else:
        item.delete()
    code = _code(school, snapshot["id"])
    for answer in (school.agent.get(school.stack_url(f"snapshots/{snapshot['id']}/archive")),
                   _download(_sibling_agent(school), code)):
        assert answer.status_code == 422
        assert answer.json()["error"]["code"] == "snapshot_unreadable"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_bucket_is_a_503_and_stores_nothing(
        school: School, bucket: Any, settings: SettingsWrapper, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    settings.TELEPORT_S3_ENDPOINT_URL = f"http://127.0.0.1:{_closed_port()}"
    before = Stack.objects.get(pk=school.stack.pk).bytes_used
    with caplog.at_level(logging.DEBUG):
        answer = _upload(school.agent, school, _hostile())
    # The log says what failed, never the credentials (botocore's DEBUG output stays off).
    assert "teleport bucket put failed: EndpointConnectionError" in caplog.text
    assert "memoryhub-test-secret" not in caplog.text and "memoryhub-test" not in caplog.text
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "snapshot_store_unavailable"
    assert "Retry-After" in answer
    assert not Snapshot.objects.exists()
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == before
    assert _objects(bucket) == {} and not (tmp_path / "store").exists()


def test_the_bucket_changes_nothing_about_who_may_read(
        school: School, other_school: School, tmp_path: Path, bucket: Any) -> None:
    _, snapshot = _workspace_upload(school, tmp_path)
    code = _code(school, snapshot["id"], one_time=False)
    assert _download(other_school.agent, code).status_code == 404
    assert other_school.admin_api.get(school.stack_url(f"snapshots/{snapshot['id']}/archive")).status_code == 404
    # The agent bound to the school's other stack needs the code: the stack itself is not its own.
    sibling = _sibling_agent(school)
    assert sibling.get(school.stack_url(f"snapshots/{snapshot['id']}/archive")).status_code == 404
    assert _download(sibling, code).status_code == 200
