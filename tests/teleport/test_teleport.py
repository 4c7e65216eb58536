"""Teleport (docs/teleport.md): a workspace goes up as a tar.gz, comes back byte-equal through a
code of the same school and the restore helper printed in the docs; hostile archives are refused
or stripped as §2 says, and nothing is written outside the restore directory; codes die when they
expire, after one use, and are useless to another school; snapshots count against the quota, are
encrypted on disk, and expired ones are purged."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import tarfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from django.utils import timezone
from pytest_django.fixtures import SettingsWrapper
from rest_framework.test import APIClient

from accounts.models import AuditEvent
from memoryhub.encryption import LOCAL_KEY_ID, keyring_from_environment
from memoryhub.errors import DomainError, PayloadTooLarge
from memoryhub.secrets import load_secrets
from stacks.models import Stack
from teleport.archive import clean_archive
from teleport.models import Snapshot, TeleportCode
from teleport.services import ORPHAN_GRACE_SECONDS, snapshots_purge
from tests.actors import School
from tests.factories import bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "teleport.md"
MARKER = b"PLAINTEXT-MARKER-the-lesson-plan-for-fractions"


@pytest.fixture(autouse=True)
def store(settings: SettingsWrapper, tmp_path: Path) -> Path:
    settings.TELEPORT_DIR = tmp_path / "store"
    return settings.TELEPORT_DIR


@pytest.fixture(scope="module")
def restore() -> Callable[[bytes, str], list[str]]:
    """The restore helper exactly as docs/teleport.md §5 prints it."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    source = next(block for block in blocks if "def restore(" in block)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOCS), "exec"), namespace)  # noqa: S102 - the documented snippet itself
    return namespace["restore"]


def _workspace(root: Path) -> dict[str, bytes]:
    files = {
        "README.md": b"# my agent\n" + MARKER,
        "src/main.py": b"print('hello')\n",
        "src/data/blob.bin": os.urandom(200_000),
        "notes/a..b.txt": b"two dots inside a name are fine",
        "empty.txt": b"",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "src/main.py").chmod(0o755)
    (root / ".env").write_bytes(b"OPENAI_API_KEY=sk-live-secret\n")
    (root / ".ssh").mkdir()
    (root / ".ssh/id_rsa").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (root / "server.pem").write_bytes(b"cert")
    (root / "link-to-readme").symlink_to("README.md")
    return files


def _pack(root: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    return buffer.getvalue()


def _hostile(*members: tarfile.TarInfo, content: bytes = b"evil") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        for member in members:
            if member.isfile():
                member.size = len(content)
                tar.addfile(member, io.BytesIO(content))
            else:
                tar.addfile(member)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = linkname
    return member


def _upload(client: APIClient, school: School, body: bytes, **params: str) -> Any:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.post(school.stack_url("snapshots") + (f"?{query}" if query else ""), data=body,
                       content_type="application/gzip")


def _code(school: School, snapshot_id: str, **body: Any) -> str:
    answer = school.agent.post(school.stack_url(f"snapshots/{snapshot_id}/codes"), body, format="json")
    assert answer.status_code == 201, answer.json()
    return str(answer.json()["code"])


def _download(client: APIClient, code: str) -> Any:
    return client.post("/api/v1/teleport/download", {"code": code}, format="json")


def _sibling_agent(school: School) -> APIClient:
    """Another agent of the same school: a key bound to the school's other stack."""
    _, secret = make_key(school.org, stack=school.other_stack, user=school.admin, name="sibling agent")
    return bearer_client(secret)


def _blob_files(store: Path) -> list[Path]:
    return list(store.glob("*/*")) if store.exists() else []


# --- round trip ------------------------------------------------------------------------------------


def test_round_trip_is_byte_equal_and_secrets_do_not_travel(
        school: School, tmp_path: Path, restore: Callable[[bytes, str], list[str]]) -> None:
    source = tmp_path / "workspace"
    source.mkdir()
    files = _workspace(source)

    answer = _upload(school.agent, school, _pack(source), name="before-break")
    assert answer.status_code == 201, answer.json()
    snapshot = answer.json()
    assert snapshot["file_count"] == len(files)
    assert {(s["name"], s["reason"]) for s in snapshot["stripped"]} == {
        (".env", "secret_file"), (".ssh/id_rsa", "secret_file"), ("server.pem", "secret_file"),
        ("link-to-readme", "link")}
    assert snapshot["unpacked_bytes"] == sum(len(c) for c in files.values())

    code = _code(school, snapshot["id"])
    assert code.startswith("tlp_")
    archive = _download(_sibling_agent(school), code)
    assert archive.status_code == 200
    assert archive["Content-Type"] == "application/gzip"

    target = tmp_path / "restored"
    written = restore(archive.content, str(target))
    assert sorted(written) == sorted(files)
    for name, content in files.items():
        assert (target / name).read_bytes() == content
    assert os.access(target / "src/main.py", os.X_OK)
    for secret in (".env", ".ssh/id_rsa", "server.pem", "link-to-readme"):
        assert not (target / secret).exists()

    # The owner reads it back too, and the listing shows it.
    listing = school.agent.get(school.stack_url("snapshots")).json()["snapshots"]
    assert [s["id"] for s in listing] == [snapshot["id"]]
    again = school.agent.get(school.stack_url(f"snapshots/{snapshot['id']}/archive"))
    assert again.status_code == 200 and again.content == archive.content
    assert set(AuditEvent.objects.filter(organization=school.org, action__startswith="teleport.")
               .values_list("action", flat=True)) == {
        "teleport.snapshot_created", "teleport.code_issued", "teleport.code_redeemed"}


def test_stored_blob_is_encrypted_content_addressed_and_private(school: School, tmp_path: Path, store: Path) -> None:
    source = tmp_path / "workspace"
    source.mkdir()
    _workspace(source)
    snapshot = _upload(school.agent, school, _pack(source)).json()
    [blob] = _blob_files(store)
    row = Snapshot.objects.get(pk=snapshot["id"])
    data = blob.read_bytes()
    assert blob.name == row.blob_sha256 and blob.parent.name == row.blob_sha256[:2]
    assert len(data) == row.stored_bytes == snapshot["stored_bytes"]
    assert MARKER not in data and b"README.md" not in data and b"main.py" not in data
    with pytest.raises(OSError):
        gzip.decompress(data)
    assert blob.stat().st_mode & 0o777 == 0o600
    assert blob.parent.stat().st_mode & 0o777 == 0o700


def test_a_blob_moved_onto_another_snapshot_does_not_open(school: School, tmp_path: Path, store: Path) -> None:
    source = tmp_path / "workspace"
    source.mkdir()
    _workspace(source)
    first = _upload(school.agent, school, _pack(source)).json()
    second = _upload(school.agent, school, _pack(source)).json()
    Snapshot.objects.filter(pk=second["id"]).update(
        blob_sha256=Snapshot.objects.get(pk=first["id"]).blob_sha256)
    answer = school.agent.get(school.stack_url(f"snapshots/{second['id']}/archive"))
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "snapshot_unreadable"


# --- hostile archives --------------------------------------------------------------------------------

REFUSED = {
    "dot-dot": _member("../evil.txt"),
    "nested dot-dot": _member("a/../../evil.txt"),
    "absolute": _member("/tmp/evil.txt"),
    "symlink outside": _member("innocent", tarfile.SYMTYPE, "../../outside"),
    "absolute symlink": _member("passwd", tarfile.SYMTYPE, "/etc/passwd"),
    "hardlink outside": _member("hard", tarfile.LNKTYPE, "../outside"),
    "char device": _member("null", tarfile.CHRTYPE),
    "block device": _member("disk", tarfile.BLKTYPE),
    "fifo": _member("pipe", tarfile.FIFOTYPE),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_member_refuses_the_whole_upload(school: School, store: Path, case: str) -> None:
    before = Stack.objects.get(pk=school.stack.pk).bytes_used
    answer = _upload(school.agent, school, _hostile(REFUSED[case]))
    assert answer.status_code == 400
    body = answer.json()
    assert body["error"]["code"] == "snapshot_unsafe_member"
    assert REFUSED[case].name in body["error"]["message"]
    assert not Snapshot.objects.exists()
    assert _blob_files(store) == []
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == before


def test_links_inside_are_stripped_not_refused(school: School) -> None:
    answer = _upload(school.agent, school, _hostile(_member("sub/ln", tarfile.SYMTYPE, "../fine.txt"),
                                                    _member("hard", tarfile.LNKTYPE, "fine.txt")))
    assert answer.status_code == 201, answer.json()
    assert answer.json()["stripped"] == [{"name": "sub/ln", "reason": "link"}, {"name": "hard", "reason": "link"}]
    assert answer.json()["file_count"] == 1


def _zeros_archive(size: int) -> bytes:
    """One file of `size` zero bytes: tiny compressed, `size` unpacked."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        zeros = tarfile.TarInfo("zeros.bin")
        zeros.size = size
        tar.addfile(zeros, io.BytesIO(bytes(size)))
    return buffer.getvalue()


def test_zip_bomb_is_stopped_at_the_limit(school: School, settings: SettingsWrapper) -> None:
    settings.TELEPORT_MAX_BYTES = 1024 * 1024
    upload = _zeros_archive(64 * 1024 * 1024)
    assert len(upload) < 200 * 1024  # small compressed, 64x the limit unpacked

    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge):
        clean_archive(upload, limit=settings.TELEPORT_MAX_BYTES)
    assert time.perf_counter() - started < 1.0  # stopped at 1 MiB, never unpacked 64 MiB

    answer = _upload(school.agent, school, upload)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "snapshot_too_large"
    assert "unpacked" in answer.json()["error"]["message"]
    assert not Snapshot.objects.exists()


SPARSE_REALSIZE = 48 * 1024 * 1024  # what a sparse member of a tiny archive claims to expand to


def _gnu_sparse(realsize: int = SPARSE_REALSIZE) -> bytes:
    """One old-style GNU sparse member ('S'), crafted by hand (tarfile reads these but never writes
    them): no data at all, a sparse map of holes and a `realsize` of the attacker's choosing."""
    info = tarfile.TarInfo("bomb.bin")
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[483:495] = b"%011o\0" % realsize  # the realsize field; the map (386-481) stays zero: holes
    header[148:156] = b" " * 8  # the checksum is computed over the header with its own field blank
    header[148:156] = b"%06o\0 " % sum(header)
    return gzip.compress(bytes(header) + bytes(2 * tarfile.BLOCKSIZE), mtime=0)


def _pax(member: tarfile.TarInfo) -> dict[str, str]:
    """The member's own pax header fields, to fill in (typeshed calls them a read-only Mapping)."""
    return cast(dict[str, str], member.pax_headers)


def _pax_sparse(version: str, realsize: int = SPARSE_REALSIZE) -> bytes:
    """The same through a pax header: GNU sparse format 0.1 (map in the header) or 1.0 (map in the data)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("bomb.bin")
        if version == "0.1":
            _pax(info).update({"GNU.sparse.map": "0,0", "GNU.sparse.size": str(realsize)})
            tar.addfile(info)
        else:
            _pax(info).update({"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                               "GNU.sparse.name": "bomb.bin", "GNU.sparse.realsize": str(realsize)})
            sparse_map = b"1\n0\n0\n".ljust(tarfile.BLOCKSIZE, b"\0")  # one empty region: all hole
            info.size = len(sparse_map)
            tar.addfile(info, io.BytesIO(sparse_map))
    return buffer.getvalue()


SPARSE: dict[str, Callable[[], bytes]] = {
    "gnu 'S' header": _gnu_sparse,
    "pax GNU.sparse 0.1": lambda: _pax_sparse("0.1"),
    "pax GNU.sparse 1.0": lambda: _pax_sparse("1.0"),
}


def _peak_bytes(work: Callable[[], object]) -> int:
    """The most memory Python held at once while `work` ran (tracemalloc), beyond what it held before."""
    tracemalloc.start()
    try:
        with contextlib.suppress(DomainError):
            work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("case", sorted(SPARSE))
def test_sparse_bomb_is_refused_without_expanding_it(school: School, store: Path, case: str) -> None:
    """A sparse member's holes are expanded by the reader to `realsize`, which the header states:
    a tiny upload would be stored as a SPARSE_REALSIZE file (and held in memory whole) against a
    16 MiB limit. Sparse members are refused outright, before any of them is read."""
    upload = SPARSE[case]()
    assert len(upload) < 250
    before = Stack.objects.get(pk=school.stack.pk).bytes_used

    assert _peak_bytes(lambda: clean_archive(upload, limit=16 * 1024 * 1024)) < 4 * 1024 * 1024  # not SPARSE_REALSIZE

    answer = _upload(school.agent, school, upload)
    assert answer.status_code == 400, answer.json()
    error = answer.json()["error"]
    assert error["code"] == "snapshot_unsafe_member"
    assert "'bomb.bin' is a sparse file" in error["message"]
    assert not Snapshot.objects.exists()
    assert _blob_files(store) == []
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == before


def test_a_sparse_member_within_the_limit_is_refused_too(school: School) -> None:
    """Not a size rule: a workspace has no reason to hold a sparse member (GNU tar writes one only
    with --sparse), so even a small one is refused (docs/teleport.md §2)."""
    answer = _upload(school.agent, school, _gnu_sparse(realsize=4096))
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "snapshot_unsafe_member"


def test_only_allowed_member_types_are_accepted(school: School) -> None:
    for kind in (tarfile.CONTTYPE, b"V", b"M", b"Z"):  # contiguous, volume label, multi-volume, unknown
        answer = _upload(school.agent, school, _hostile(_member("odd", kind)))
        assert answer.status_code == 400, kind
        assert answer.json()["error"]["code"] == "snapshot_unsafe_member"
        assert "'odd'" in answer.json()["error"]["message"]
    assert not Snapshot.objects.exists()


def test_kept_files_are_streamed_not_held_in_memory(school: School, settings: SettingsWrapper) -> None:
    """A 12 MiB file under the 16 MiB limit is copied into the cleaned archive in chunks: the clean
    never holds the member whole (it did: `read()` of the member, 12 MiB at once)."""
    upload = _zeros_archive(12 * 1024 * 1024)
    limit = int(settings.TELEPORT_MAX_BYTES)
    assert limit == 16 * 1024 * 1024

    assert _peak_bytes(lambda: clean_archive(upload, limit=limit)) < 4 * 1024 * 1024
    answer = _upload(school.agent, school, upload)
    assert answer.status_code == 201, answer.json()
    assert answer.json()["unpacked_bytes"] == 12 * 1024 * 1024


def test_a_member_declaring_more_than_the_limit_is_refused_before_it_is_read(school: School) -> None:
    """A pax header may state any size: one over the limit is refused on its word (413), not read."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        liar = tarfile.TarInfo("liar.bin")
        _pax(liar).update({"size": str(2**40)})
        tar.addfile(liar)
    answer = _upload(school.agent, school, buffer.getvalue())
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "snapshot_too_large"
    assert not Snapshot.objects.exists()


def test_oversized_upload_and_non_gzip_are_clear_4xx(school: School, settings: SettingsWrapper) -> None:
    settings.TELEPORT_MAX_BYTES = 64 * 1024
    answer = _upload(school.agent, school, b"\x1f\x8b" + os.urandom(70 * 1024))
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "snapshot_too_large"
    for body in (b"plain text, not an archive", b"\x1f\x8b\x08\x00garbage", gzip.compress(b"not a tar" * 100), b""):
        answer = _upload(school.agent, school, body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["code"] == "snapshot_not_targz"
    answer = school.agent.post(school.stack_url("snapshots"), {"a": 1}, format="json")
    assert answer.status_code == 415
    assert not Snapshot.objects.exists()


def test_restore_helper_refuses_links_specials_and_escapes(
        tmp_path: Path, restore: Callable[[bytes, str], list[str]]) -> None:
    """The documented helper is the client's last line: archives from anywhere (not only our server)
    must not write outside the target."""
    outside = tmp_path / "outside"
    for member in (*REFUSED.values(), _member("ok-link", tarfile.SYMTYPE, "fine.txt")):
        target = tmp_path / "target"
        with pytest.raises(ValueError, match="refusing"):
            restore(_hostile(member), str(target))
        assert not (target / "fine.txt").exists()  # refused before anything was written
    for make in SPARSE.values():  # it would write a 48 MiB file of holes
        with pytest.raises(ValueError, match=r"refusing 'bomb\.bin'"):
            restore(make(), str(tmp_path / "target"))
    # A symlink already in the target directory does not lead a member outside either.
    target = tmp_path / "target"
    outside.mkdir()
    (target / "escape").symlink_to(outside)
    with pytest.raises(ValueError, match="outside"):
        restore(_hostile(_member("escape/evil.txt")), str(target))
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "evil.txt").exists()


# --- codes --------------------------------------------------------------------------------------------


@pytest.fixture
def snapshot_id(school: School) -> str:
    answer = _upload(school.agent, school, _hostile())
    assert answer.status_code == 201
    return str(answer.json()["id"])


def test_one_time_code_works_once(school: School, snapshot_id: str) -> None:
    code = _code(school, snapshot_id)
    sibling = _sibling_agent(school)
    assert _download(sibling, code).status_code == 200
    again = _download(sibling, code)
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "teleport_code_not_found"


def test_reusable_code_works_until_it_expires(school: School, snapshot_id: str) -> None:
    code = _code(school, snapshot_id, one_time=False)
    sibling = _sibling_agent(school)
    assert _download(sibling, code).status_code == 200
    assert _download(sibling, code).status_code == 200
    TeleportCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _download(sibling, code).status_code == 404


def test_code_lifetime_is_capped(school: School, snapshot_id: str) -> None:
    answer = school.agent.post(school.stack_url(f"snapshots/{snapshot_id}/codes"),
                               {"one_time": False, "expires_in_days": 31}, format="json")
    assert answer.status_code == 400
    _code(school, snapshot_id, one_time=False)
    code = TeleportCode.objects.get()
    snapshot = Snapshot.objects.get(pk=snapshot_id)
    assert code.expires_at <= snapshot.expires_at <= timezone.now() + timedelta(days=30)
    assert code.code_hash and len(code.code_hash) == 64


def test_code_of_school_a_is_useless_to_school_b(school: School, other_school: School, snapshot_id: str) -> None:
    code = _code(school, snapshot_id)
    for client in (other_school.agent, other_school.admin_api):
        answer = _download(client, code)
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "teleport_code_not_found"
    # The other school's tries did not use the one-time code up.
    assert _download(_sibling_agent(school), code).status_code == 200


def test_expired_or_deleted_snapshot_ends_its_codes(school: School, snapshot_id: str) -> None:
    code = _code(school, snapshot_id, one_time=False)
    expire = school.agent.post(school.stack_url(f"snapshots/{snapshot_id}/expire"))
    assert expire.status_code == 200
    assert _download(school.agent, code).status_code == 404
    assert school.agent.get(school.stack_url(f"snapshots/{snapshot_id}")).status_code == 404
    assert school.agent.get(school.stack_url("snapshots")).json()["snapshots"] == []


def test_unknown_and_malformed_codes_are_404(school: School) -> None:
    for code in ("tlp_" + "0" * 32, "knl_sk_nope", "x" * 99):
        assert _download(school.agent, code).status_code == 404
    assert _download(school.agent, "x" * 101).status_code == 400


# --- isolation, access ------------------------------------------------------------------------------


def test_other_schools_and_other_stacks_cannot_reach_snapshots(
        school: School, other_school: School, snapshot_id: str) -> None:
    alice = school.stack_url(f"snapshots/{snapshot_id}")
    for client in (other_school.agent, other_school.admin_api):
        assert client.get(school.stack_url("snapshots")).status_code == 404
        assert client.get(alice).status_code == 404
        assert client.get(alice + "/archive").status_code == 404
        assert client.post(alice + "/codes", {}, format="json").status_code == 404
        assert client.post(alice + "/expire").status_code == 404
        assert client.delete(alice).status_code == 404
        assert _upload(client, school, _hostile()).status_code == 404
    # An agent bound to "bob" reaches nothing of "alice", even naming the id under its own stack.
    sibling = _sibling_agent(school)
    assert sibling.get(alice).status_code == 404
    bob = f"/api/v1/stacks/{school.other_stack.slug}/snapshots/{snapshot_id}"
    assert school.admin_api.get(bob).status_code == 404
    assert Snapshot.objects.filter(pk=snapshot_id).exists()


def test_read_only_key_reads_but_cannot_write(school: School, snapshot_id: str) -> None:
    _, secret = make_key(school.org, stack=school.stack, user=school.admin, read_only=True, name="ro")
    reader = bearer_client(secret)
    assert reader.get(school.stack_url(f"snapshots/{snapshot_id}/archive")).status_code == 200
    assert _upload(reader, school, _hostile()).status_code == 403
    assert reader.post(school.stack_url(f"snapshots/{snapshot_id}/codes"), {}, format="json").status_code == 403
    assert reader.delete(school.stack_url(f"snapshots/{snapshot_id}")).status_code == 403


# --- the encryption key on `make run`'s defaults ------------------------------------------------------


def test_a_fresh_make_run_data_dir_stores_snapshots_under_its_kept_key(
        school: School, settings: SettingsWrapper, tmp_path: Path) -> None:
    """No MEMORYHUB_ENCRYPTION_KEYS, not production, not the test suite: the keyring settings build
    from a fresh data dir's secrets seals (every upload was a 503 encryption_unavailable)."""
    kept = load_secrets(tmp_path / "var", production=False, environ={})
    settings.ENCRYPTION_KEYRING = keyring_from_environment({}, secret_key=kept.secret_key, development=False,
                                                           kept_key=kept.encryption_key)
    answer = _upload(school.agent, school, _hostile())
    assert answer.status_code == 201, answer.json()
    assert Snapshot.objects.get(pk=answer.json()["id"]).key_id == LOCAL_KEY_ID
    archive = school.agent.get(school.stack_url(f"snapshots/{answer.json()['id']}/archive"))
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as restored:
        assert restored.getnames() == ["fine.txt"]

    # Production without configured keys keeps no key: uploads are refused, nothing stored (unchanged).
    settings.ENCRYPTION_KEYRING = keyring_from_environment({}, secret_key=kept.secret_key, development=False)
    refused = _upload(school.agent, school, _hostile())
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "encryption_unavailable"
    assert Snapshot.objects.count() == 1


# --- quota and purge ----------------------------------------------------------------------------------


def test_snapshots_count_against_the_storage_quota(store: Path) -> None:
    org = make_org(tier="free")  # 10 MB
    admin = make_user(org)
    stack = make_stack(org, "solo")
    _, secret = make_key(org, stack=stack, user=admin)
    client = bearer_client(secret)
    url = f"/api/v1/stacks/{stack.slug}/snapshots"
    first = client.post(url, data=_hostile(), content_type="application/gzip")
    assert first.status_code == 201
    assert Stack.objects.get(pk=stack.pk).bytes_used == first.json()["stored_bytes"]

    Stack.objects.filter(pk=stack.pk).update(bytes_used=10 * 1024 * 1024 - 100)
    refused = client.post(url, data=_hostile(content=os.urandom(4096)), content_type="application/gzip")
    assert refused.status_code == 402
    assert refused.json()["error"]["code"] == "storage_quota_exceeded"
    assert Snapshot.objects.filter(stack=stack).count() == 1
    assert len(_blob_files(store)) == 1

    # Deleting gives the bytes back.
    assert client.delete(f"{url}/{first.json()['id']}").status_code == 204
    assert Stack.objects.get(pk=stack.pk).bytes_used == 10 * 1024 * 1024 - 100 - first.json()["stored_bytes"]


def test_purge_removes_expired_snapshots_codes_and_orphan_blobs(
        school: School, store: Path, django_capture_on_commit_callbacks: Any) -> None:
    keep = _upload(school.agent, school, _hostile()).json()
    gone = _upload(school.agent, school, _hostile(content=b"other")).json()
    _code(school, gone["id"], one_time=False)  # goes with its snapshot
    _code(school, keep["id"], one_time=False)
    TeleportCode.objects.filter(snapshot_id=keep["id"]).update(expires_at=timezone.now())  # expired
    used = _code(school, keep["id"])  # used up below
    assert _download(school.agent, used).status_code == 200
    used_bytes = Stack.objects.get(pk=school.stack.pk).bytes_used
    Snapshot.objects.filter(pk=gone["id"]).update(expires_at=timezone.now() - timedelta(minutes=1))
    orphan = store / "ab" / ("ab" + "0" * 62)
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"left by a failed upload")
    old = time.time() - ORPHAN_GRACE_SECONDS - 10
    os.utime(orphan, (old, old))

    with django_capture_on_commit_callbacks(execute=True):
        counts = snapshots_purge()
    assert counts == {"snapshots": 1, "codes": 2, "orphan_blobs": 1}
    assert list(Snapshot.objects.values_list("pk", flat=True)) == [Snapshot.objects.get(pk=keep["id"]).pk]
    assert not TeleportCode.objects.exists()
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == used_bytes - gone["stored_bytes"]
    assert [p.name for p in _blob_files(store)] == [Snapshot.objects.get(pk=keep["id"]).blob_sha256]
    assert snapshots_purge() == {"snapshots": 0, "codes": 0, "orphan_blobs": 0}  # idempotent


def test_erasing_the_stack_erases_its_snapshots(
        school: School, store: Path, django_capture_on_commit_callbacks: Any) -> None:
    snapshot = _upload(school.agent, school, _hostile()).json()
    code = _code(school, snapshot["id"], one_time=False)
    with django_capture_on_commit_callbacks(execute=True):
        answer = school.admin_api.post(school.stack_url("erase"), {"requested_by": "parent, letter 2026-11-20",
                                                                   "confirm": school.stack.slug}, format="json")
    assert answer.status_code in (200, 201), answer.json()
    assert not Snapshot.objects.exists() and not TeleportCode.objects.exists()
    assert _blob_files(store) == []
    assert _download(_sibling_agent(school), code).status_code == 404
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == 0
