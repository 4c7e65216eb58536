"""Privacy grants of keys bound to a stack (docs/privacy.md "Keys and the grants").

The attack: a school admin whose session gets 404 for a memory only the student may read issued a
read-only key bound to the student's stack, and that key — and its kernle JWT — counted as "the
stack's own credentials" and read the memory, its exports and the kernle pull. The same worked for a
teacher whose school lets teachers manage keys, and for a school key.

Now a key reads what whoever issued it may read, and only a key issued, by an explicit and audited
choice (`stack_agent`), as the student's own agent reads all of the stack. The grants matrix of
tests/memories/test_grants.py, with memories granted to each kind of requester, crossed with keys
issued through the real API by an admin, a teacher and a school key (and the JWTs of the kernle
login of such a key), through every read path (search, load, list, get, MEMORY.md, the archive,
kernle and native pull) and the MCP read tools: each key sees exactly what its issuer sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.http import HttpRequest
from rest_framework.request import Request
from rest_framework.test import APIClient

from accounts.authentication import BearerAuthentication
from accounts.models import ApiKey, AuditEvent, Membership, Organization
from accounts.principal import Principal
from accounts.services import membership_add
from agents.mcp_tools import call_tool
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import bearer_client
from tests.memories.test_grants import Cast, _cast, api_reads

STUDENT = "human:usr_student0001"  # the student's own id: no member of staff answers to it


def grants_by_label(school: School) -> dict[str, list[str]]:
    return {
        "empty": [],
        "student_only": [STUDENT],
        "role_admin": ["role:admin"],
        "human_admin": [f"human:{school.admin.public_id}"],
        "role_teacher": ["role:teacher"],
        "human_teacher": [f"human:{school.teacher.public_id}"],
        "role_school_key": ["role:school_key"],
        "the_school_key": [f"key:{school.admin_key.public_id}"],
        "org": [f"org:{school.org.public_id}"],
        "everyone": ["*"],
    }


ALL = {"empty", "student_only", "role_admin", "human_admin", "role_teacher", "human_teacher", "role_school_key",
       "the_school_key", "org", "everyone"}  # the labels of grants_by_label
COMMON = {"empty", "org", "everyone"}
# What each signed-in person and the school key see under the default policy ("school")…
ADMIN = COMMON | {"role_admin", "human_admin"}
TEACHER = COMMON | {"role_teacher", "human_teacher"}
SCHOOL_KEY = COMMON | {"role_school_key", "the_school_key"}
# … and each requester of the matrix: a key reads exactly what its issuer reads.
ADMITTED = {
    "admin session": ADMIN,
    "teacher session": TEACHER,
    "school key": SCHOOL_KEY,
    "key issued by the admin": ADMIN,
    "JWT of the key issued by the admin": ADMIN,
    "key issued by the teacher": TEACHER,
    "key issued by the school key": SCHOOL_KEY,
    "JWT of the key issued by the school key": SCHOOL_KEY,
    "key issued as the student's own agent": ALL,
    "JWT of the student's own agent key": ALL,
}


def expected(requester: str, policy: str) -> set[str]:
    seen = set(ADMITTED[requester])
    if policy == "owner" and ADMITTED[requester] is not ALL:
        seen.discard("empty")
    return seen


@dataclass
class Issued:
    """Secrets of keys bound to the student's stack, issued through `POST /api/v1/keys/`."""

    by_admin: str
    by_teacher: str
    by_school_key: str
    stack_agent: str


def issue(client: APIClient, school: School, **fields: Any) -> dict[str, Any]:
    response = client.post("/api/v1/keys/", {"stack_id": school.stack.slug, "read_only": True, **fields},
                           format="json")
    assert response.status_code == 201, response.content
    return response.json()


def issued_keys(school: School) -> Issued:
    Organization.objects.filter(pk=school.org.pk).update(teachers_may_manage_keys=True)
    admin = csrf_session_client(school.admin)
    return Issued(by_admin=issue(admin, school)["key"],
                  by_teacher=issue(csrf_session_client(school.teacher), school)["key"],
                  by_school_key=issue(school.admin_api, school)["key"],
                  stack_agent=issue(admin, school, stack_agent=True)["key"])


def kernle_token(secret: str) -> str:
    response = APIClient().post("/auth/login", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content
    return str(response.json()["token"])


def credential_of(school: School, keys: Issued, requester: str) -> str:
    """The Bearer credential of a requester that is a key or a key's JWT (kernle's login)."""
    secret = {
        "school key": school.admin_secret,
        "key issued by the admin": keys.by_admin,
        "JWT of the key issued by the admin": keys.by_admin,
        "key issued by the teacher": keys.by_teacher,
        "key issued by the school key": keys.by_school_key,
        "JWT of the key issued by the school key": keys.by_school_key,
        "key issued as the student's own agent": keys.stack_agent,
        "JWT of the student's own agent key": keys.stack_agent,
    }[requester]
    return kernle_token(secret) if requester.startswith("JWT") else secret


def client_of(school: School, keys: Issued, requester: str) -> APIClient:
    if requester == "admin session":
        return csrf_session_client(school.admin)
    if requester == "teacher session":
        return csrf_session_client(school.teacher)
    return bearer_client(credential_of(school, keys, requester))


def setup(school: School, policy: str = "school") -> tuple[Cast, Issued]:
    keys = issued_keys(school)  # before the memories: issuing writes nothing into the stack
    return _cast(school, policy, grants_by_label(school)), keys


# --- the attack -----------------------------------------------------------------------------------


def test_an_admin_cannot_read_a_students_private_memory_through_a_key_they_issue(school: School) -> None:
    cast, _ = setup(school)
    private = cast.memories["student_only"]
    admin = csrf_session_client(school.admin)
    url = school.stack_url(f"memories/{private.pk}")
    assert admin.get(url).status_code == 404
    # The probe's steps: a read-only key bound to the student's stack, then its kernle token.
    secret = issue(admin, school)["key"]
    for credential in (secret, kernle_token(secret)):
        client = bearer_client(credential)
        assert client.get(url).status_code == 404
        pulled = client.post("/sync/pull", {"stack_id": school.stack.slug, "since": None}, format="json").json()
        assert private.record_id not in {op["record_id"] for op in pulled["operations"]}
        assert b"(student only)" not in client.get(school.stack_url("export/memory.md")).content
    # The student's own agent key still reads it.
    assert school.agent.get(url).status_code == 200


# --- the matrix: every read path ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["school", "owner"])
@pytest.mark.parametrize("requester", list(ADMITTED))
def test_every_read_path_shows_a_key_exactly_what_its_issuer_sees(school: School, requester: str,
                                                                  policy: str) -> None:
    cast, keys = setup(school, policy)
    seen = api_reads(cast, client_of(school, keys, requester))
    want = expected(requester, policy)
    assert seen == dict.fromkeys(seen, want), (requester, policy)


def mcp_principal(credential: str) -> Principal:
    """The Principal the MCP endpoint builds from a Bearer credential (agents.mcp_server._authenticate)."""
    request = HttpRequest()
    request.META.update(HTTP_AUTHORIZATION=f"Bearer {credential}", REMOTE_ADDR="127.0.0.1")
    result = BearerAuthentication().authenticate(Request(request))
    assert result is not None
    return result[1]


def mcp_reads(cast: Cast, principal: Principal) -> dict[str, set[str]]:
    """What the MCP read tools (memory_search, memory_load, memory_get, memory_md) show `principal`."""
    stack = {"stack": cast.school.stack.slug}

    def run(name: str, **arguments: Any) -> Any:
        return call_tool(principal, name, {**stack, **arguments})

    seen: dict[str, set[str]] = {}
    searched = run("memory_search", query="pizza fractions", limit=50)
    assert not searched.is_error, searched.payload
    seen["memory_search"] = cast.labels(hit["id"] for hit in searched.payload["results"])
    loaded = run("memory_load", budget=50000)
    assert not loaded.is_error, loaded.payload
    seen["memory_load"] = cast.labels([item["id"] for item in loaded.payload["memories"]]
                                      + [echo["id"] for echo in loaded.payload["echoes"]])
    seen["memory_get"] = set()
    for label, memory in cast.memories.items():
        got = run("memory_get", memory_id=str(memory.pk))
        assert not got.is_error or got.payload["status"] == 404, got.payload
        if not got.is_error:
            seen["memory_get"].add(label)
    markdown = run("memory_md")
    assert not markdown.is_error, markdown.payload
    seen["memory_md"] = cast.named_in(markdown.payload["markdown"])
    return seen


@pytest.mark.parametrize("requester", [name for name in ADMITTED if "session" not in name])
def test_the_mcp_read_tools_show_a_key_exactly_what_its_issuer_sees(school: School, requester: str) -> None:
    cast, keys = setup(school)
    seen = mcp_reads(cast, mcp_principal(credential_of(school, keys, requester)))
    assert seen == dict.fromkeys(seen, ADMITTED[requester]), requester


# --- what a key answers to follows its issuer ------------------------------------------------------


def test_a_key_reads_with_its_issuers_current_role(school: School) -> None:
    """The stack's teacher, made an admin for a while, issues a key; lowered back to teacher (still
    assigned, so the key keeps working) the key from then on reads what a teacher reads: `role:admin`
    memories no more, `role:teacher` ones again."""
    cast = _cast(school, "school", grants_by_label(school))
    membership_add(organization=school.org, user=school.teacher, role=Membership.Role.ADMIN)
    secret = issue(csrf_session_client(school.teacher), school)["key"]
    key = bearer_client(secret)
    role_admin, role_teacher = cast.memories["role_admin"], cast.memories["role_teacher"]
    assert key.get(school.stack_url(f"memories/{role_admin.pk}")).status_code == 200
    assert key.get(school.stack_url(f"memories/{role_teacher.pk}")).status_code == 404

    membership_add(organization=school.org, user=school.teacher, role=Membership.Role.TEACHER)
    assert ApiKey.objects.get(key_prefix=secret[:12]).revoked_at is None  # still within the teacher's reach
    assert key.get(school.stack_url(f"memories/{role_admin.pk}")).status_code == 404
    assert key.get(school.stack_url(f"memories/{role_teacher.pk}")).status_code == 200


def test_the_kernle_register_key_is_the_stacks_own(school: School) -> None:
    """A personal account's register key (and its token) is the agent's own credential: a memory it
    wrote for its person only comes back to it, by key and by token (kernle's own flow)."""
    registered = APIClient().post("/auth/register", {"stack_id": "ada-agent"}, format="json").json()
    key = ApiKey.objects.get(public_id=registered["key_id"])
    assert key.stack_agent is True
    assert AuditEvent.objects.filter(action="key.issued_as_stack_agent", target_id=key.public_id).exists()
    for credential in (registered["secret"], registered["access_token"]):
        client = bearer_client(credential)
        created = client.post("/api/v1/stacks/ada-agent/memories", {
            "kind": "note", "content": "only for me", "access_grants": [STUDENT]}, format="json")
        assert created.status_code == 201, created.content
        assert client.get(f"/api/v1/stacks/ada-agent/memories/{created.json()['id']}").status_code == 200
