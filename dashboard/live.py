"""What the dashboard's live sockets send, and who may keep one open (docs/architecture.md §10,
"Live pages").

The sockets (dashboard/consumers.py) are thin: every decision and every read is here, in plain sync
functions they call off the event loop.

* Who: a socket belongs to one signed-in session. `session_user` re-reads that session by Django's
  own rule (the session exists and its stored auth hash still matches the user's: logout, a password
  change or `accounts.services.sessions_end` all end it), `principal_for_session` says who the user
  acts as, and `stacks.selectors.stack_for_principal` / `stacks_visible_to` decide the stack — the
  same calls the pages make (dashboard.access, dashboard/views/student.py); nothing here restates a
  rule. Access is checked at the handshake, again for every message a socket renders, every
  RECHECK_SECONDS, and at once when a signal below says it may have changed.
* What: a change event (memories.changes, EVENT_DICT) names memory ids; the student page gets each
  memory rendered with the page's own row partial (templates/dashboard/student/_memory_row.html),
  whether it still matches the page's filters (the page's own filter rule, dashboard.student), the
  kind tabs' counts and the header figures — so the page inserts, replaces or removes rows by id
  and never needs to know a rule. One render serves every socket showing the same stack with the
  same filters and the same privacy-grants audience (`_shared`): fifty open pages cost one render
  per event, not fifty.
* Grants: the event's memory ids are narrowed to those the viewer's grants admit (memories.privacy.grants)
  in one SQL query before anything is rendered, so a socket never receives the id or text of a
  memory the viewer cannot see, not even as "removed". A change whose memories are ALL hidden from
  the viewer (and that touched no checkpoint or boot config) is not sent to that viewer at all —
  no message, no count, not even that something changed; a change too big to resolve row by row
  reports only how many of its memories the viewer may see. (A memory whose grants stop admitting
  the viewer stays on an open page until it is reloaded.)
* Close codes (for clients; dashboard/consumers.py lists the messages): CLOSE_SIGNED_OUT 4401 (the
  session ended), CLOSE_NO_ACCESS 4403 (the stack or school is no longer within reach); the
  handshake itself is refused (HTTP 403) for no session, a stack out of reach, or a foreign Origin.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import import_module
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, load_backend
from django.contrib.auth.signals import user_logged_out
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.db import transaction
from django.db.models import Sum
from django.db.models.signals import post_delete, post_save
from django.http import QueryDict
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.formats import number_format

from accounts.authors import Path
from accounts.models import Membership, User
from accounts.principal import Principal
from accounts.selectors import principal_for_session
from accounts.signals import sessions_ended
from dashboard import student as reads
from dashboard.access import GUARDIANS, STAFF
from memories.changes.feed import events_after, latest_seq
from memories.models import ChangeEvent, StackDailyActivity
from memories.privacy.grants import Audience, audience_for
from memories.reads.access_log import AccessPath, record_principal_access
from memories.selectors import boot_config_entries, memories_by_id, memories_named
from memories.writes.outbox import BOOT_CONFIG, CHECKPOINT
from memoryhub.errors import NotFound
from stacks.models import Stack, TeacherAssignment
from stacks.selectors import stack_for_principal, stacks_visible_to

logger = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4401
CLOSE_NO_ACCESS = 4403
# How often an open socket re-reads its session and access even when no signal came (a session
# deleted straight from the store, a change made by another process whose signal was lost).
RECHECK_SECONDS = 15.0
# A resume sends at most this many events; a client further behind is told to reload the page.
CATCH_UP_EVENTS = 500
# An event naming more memories than this (a decay pass, a big import) is not resolved row by row:
# the page is told how many changed and offers a refresh.
RESOLVE_IDS_MAX = 1000
FAMILY_ROW = "dashboard/families/_memory_row.html"  # a guardian's child page's row (dashboard/views/families.py)


# --- groups and who is asking ---------------------------------------------------------------------

def session_group(session_key: str) -> str:
    """The channel-layer group of every socket opened by one session (a hash: group names are
    visible to anyone reading Redis, session keys must not be)."""
    return "live.session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def user_group(user_id: int) -> str:
    return f"live.user.{user_id}"


def session_user(session_key: str | None) -> User | None:
    """The user signed in to this session now, or None: the session is gone (logged out, expired),
    or its stored auth hash no longer matches (password changed, `sessions_end`). Django's rule
    (django.contrib.auth.get_user), read without writing: get_user would flush or re-key the
    session on a mismatch, which is the page's business, not a socket's."""
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        user_id, backend_path = session[SESSION_KEY], session[BACKEND_SESSION_KEY]
    except KeyError:
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(User._meta.pk.to_python(user_id))
    if not isinstance(user, User):
        return None
    stored = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return user if stored and any(constant_time_compare(stored, h) for h in hashes) else None


def staff_principal(user: User, *, families: bool = False) -> Principal:
    """Who the user acts as, if the live pages are for them (the pages' roles: dashboard.access.STAFF;
    with `families`, a guardian too: their child's page is live, docs/guardians.md)."""
    principal = principal_for_session(user)
    if principal is None or principal.role not in (STAFF | GUARDIANS if families else STAFF):
        raise NotFound("There is no such page.", code="not_found")
    return principal


def stack_access(user: User, slug: str) -> tuple[Principal, Stack]:
    """The stack `slug` if the user may watch it now (NotFound otherwise): the page's own check (a
    guardian reaches only their own children, as on their pages)."""
    principal = staff_principal(user, families=True)
    return principal, stack_for_principal(principal, slug)


def is_family(principal: Principal) -> bool:
    """Does this viewer see the family's page (its rows, never forgotten memories) rather than the staff's?"""
    return principal.role in GUARDIANS and principal.api_key is None


def recheck(session_key: str, user_id: int, slug: str | None) -> int | None:
    """None while the socket may stay open; else the close code. Access first: a member removed
    from the school is told "no access" rather than merely "signed out" (their sessions end too)."""
    user = User.objects.filter(pk=user_id, is_active=True).first()
    try:
        if user is None:
            raise NotFound("Gone.", code="not_found")
        if slug is None:
            staff_principal(user)
        else:
            stack_access(user, slug)
    except NotFound:
        return CLOSE_NO_ACCESS
    current = session_user(session_key)
    if current is None or current.pk != user_id:
        return CLOSE_SIGNED_OUT
    return None


# --- the student page -----------------------------------------------------------------------------

def page_filters(query_string: bytes | str) -> reads.MemoryFilters | None:
    """The page's filters from the socket URL's query (the page passes on its own): the same form
    the page validated them with. None if they are invalid (the page showed an error; nothing to
    keep live)."""
    query = QueryDict(query_string if isinstance(query_string, str) else query_string.decode("latin-1"))
    form = reads.MemoryFilterForm(query)
    return reads.MemoryFilters.of(form.cleaned_data) if form.is_valid() else None


def since_of(query_string: bytes | str) -> int | None:
    """`?since=<seq>`: the last change the page has; None when absent or not a sequence number."""
    query = QueryDict(query_string if isinstance(query_string, str) else query_string.decode("latin-1"))
    value = query.get("since", "")
    return int(value) if value.isdigit() and len(value) <= 19 else None


def stack_seq(stack: Stack) -> int:
    """The stack's newest change sequence number: a page reads it BEFORE its memories, and its
    socket resumes from it, so a change committed between the two is sent (again) and nothing is
    missed; applying a change twice is harmless (rows are replaced by id)."""
    return latest_seq(stack)


@dataclass(frozen=True)
class Change:
    """Events to render together (a live one, or a resume's catch-up)."""

    event_ids: tuple[int, ...]
    seq: int
    topics: frozenset[str]
    memory_ids: tuple[str, ...]
    # The events' actions ("create", "batch", "embedded", …); empty: not known.
    actions: frozenset[str] = frozenset()


# Actions that change nothing a student page shows: no row, count or figure shows whether a memory
# has its vector yet. Such an event is sent as its seq only (the page resumes past it), without
# rendering rows or counting — under bench/soak.py most events a page gets are "embedded".
UNSEEN_ACTIONS = frozenset({"embedded"})
# Such an event is held back this long by the socket (dashboard/consumers.py): the next change the
# page sees covers it (live.changes_through merges everything up to it), so most are never sent
# alone; a page that sees nothing else in that time is sent the seq on its own.
UNSEEN_DELAY_SECONDS = 3.0


def unseen(event: dict[str, Any]) -> bool:
    """Does this published event change nothing a student page shows (`UNSEEN_ACTIONS`)?"""
    return event.get("action") in UNSEEN_ACTIONS


def change_of(event: dict[str, Any]) -> Change:
    return Change(event_ids=(int(event["id"]),), seq=int(event["seq"]), topics=frozenset({str(event["topic"])}),
                  memory_ids=tuple(str(i) for i in event.get("memory_ids") or ()),
                  actions=frozenset({str(event["action"])}) if event.get("action") else frozenset())


def catch_up(stack: Stack, since: int) -> tuple[Change | None, bool]:
    """Every change after `since`, merged into one (each memory rendered once, as it is now), and
    whether the page is too far behind to catch up (more than CATCH_UP_EVENTS): reload instead."""
    events = events_after(stack, since, limit=CATCH_UP_EVENTS + 1)
    if len(events) > CATCH_UP_EVENTS:
        return None, True
    return _merged(events), False


def changes_through(stack_id: int, sent: int, published: int) -> Change | None:
    """A live socket's next message, when the event of seq `published` arrives and the socket has
    sent everything up to seq `sent`: every committed event between, merged (at most
    CATCH_UP_EVENTS; the socket asks again from the seq reached). None: no such event is stored.

    Events of a stack COMMIT in seq order (memories.writes.outbox) but are not always PUBLISHED in it: an
    event whose publisher died is published later by the relay, after newer ones. Sending what lies
    between, not just the event that arrived, keeps what a page has seen gap-free up to its seq, so
    its resume point (`?since=<seq>`) misses nothing; the late event itself then arrives at or
    below the socket's seq and is skipped (StackConsumer.stack_change)."""
    return _merged(events_after(stack_id, sent, limit=CATCH_UP_EVENTS, through=published))


def _merged(events: Sequence[ChangeEvent]) -> Change | None:
    if not events:
        return None
    ids: dict[str, None] = {}
    for event in events:
        ids.update(dict.fromkeys(str(i) for i in event.memory_ids or ()))
    return Change(event_ids=tuple(e.pk for e in events), seq=max(e.seq for e in events),
                  topics=frozenset(e.topic for e in events), memory_ids=tuple(ids),
                  actions=frozenset(e.action for e in events))


def _when(value: datetime | None) -> dict[str, str] | None:
    if value is None:
        return None
    return {"iso": value.isoformat(), "text": str(naturaltime(value))}  # as the pages' naturaltime says it


def _stack_figures(stack: Stack) -> dict[str, Any]:
    return {"memories": number_format(stack.memory_count, force_grouping=True),
            "storage": filesizeformat(stack.bytes_used), "last_sync": _when(stack.last_sync_at)}


def student_message(principal: Principal, stack: Stack, filters: reads.MemoryFilters,
                    change: Change) -> dict[str, Any] | None:
    """What a student page needs to show `change` to `principal` (see the module doc), or None when
    every memory it names is hidden from them: nothing is sent. `stack` as the access check just read
    it (`stack_access`). Shared by every socket on the same stack, filters and grants audience:
    rendered once per change."""
    audience = audience_for(principal, stack_id=stack.pk)
    family = is_family(principal)
    if family:  # a family's page never lists forgotten memories, whatever its query says
        filters = replace(filters, forgotten="exclude")
    message = _shared((change.event_ids, stack.pk, filters, audience, family),
                      lambda: _student_message(stack, filters, change, audience, family=family))
    if message is not None:  # the rows pushed carry memory text: this viewer was served them
        record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.LIVE,
                                memory_ids=[row["id"] for row in message.get("rows", ())])
    return message


def _student_message(stack: Stack, filters: reads.MemoryFilters, change: Change,
                     audience: Audience | None, *, family: bool = False) -> dict[str, Any] | None:
    message: dict[str, Any] = {"type": "change", "events": list(change.event_ids), "seq": change.seq,
                               "rows": [], "removed": [], "unresolved": 0}
    named = memory_ids(change.memory_ids)
    # The named memories the viewer's grants admit, by id: (pk, created_at, live?).
    found = {str(row[0]): row for row in memories_named(stack_id=stack.pk, ids=named, audience=audience)}
    ids = named if audience is None else [memory_id for memory_id in named if memory_id in found]
    working_state = bool(change.topics & {CHECKPOINT, BOOT_CONFIG})
    if named and not ids and not working_state:
        return None  # only memories this viewer may not see: even the fact of the change stays hidden
    if change.actions and change.actions <= UNSEEN_ACTIONS:
        return message  # nothing on the page changes: the seq only
    resolve = len(ids) <= RESOLVE_IDS_MAX
    existing = {pk: created_at for pk, created_at, live in found.values() if live} if resolve else {}
    counts, listed = reads.kind_counts_and_listed(stack, filters, audience=audience, ids=existing)
    if not resolve:
        message["unresolved"] = len(ids)
    elif ids:
        message.update(_rows(stack, ids, existing, listed,
                             row_template=FAMILY_ROW if family else "dashboard/student/_memory_row.html"))
    message.update(counts=counts, total=sum(counts.values()), figures=_stack_figures(stack))
    if CHECKPOINT in change.topics:
        message["checkpoint"] = render_to_string("dashboard/student/_checkpoint.html", reads.checkpoint_panel(stack))
    if BOOT_CONFIG in change.topics:
        message["boot_config"] = render_to_string("dashboard/student/_boot_config.html",
                                                  {"boot_config": list(boot_config_entries(stack=stack))})
    return message


def memory_ids(values: Iterable[str]) -> list[str]:
    """The memory ids an event names, as UUID strings (anything else names no memory)."""
    ids = []
    for value in values:
        try:
            ids.append(str(uuid.UUID(value)))
        except (TypeError, ValueError):
            continue
    return ids


def _rows(stack: Stack, ids: Sequence[str], existing: dict[uuid.UUID, datetime], listed: set[uuid.UUID], *,
          row_template: str) -> dict[str, Any]:
    """Of `ids` (narrowed to what the viewer's grants admit), the newest PAGE_SIZE of those that
    still exist (`existing`: their creation times) rendered, each saying whether the page lists it
    (`listed`: the page's own filter rule, dashboard.student), and the ids that no longer exist:
    more than a page of them could never all be on the first page."""
    newest = sorted(existing, key=lambda pk: (existing[pk], str(pk)), reverse=True)[: reads.PAGE_SIZE]
    memories = memories_by_id(stack_id=stack.pk, ids=newest)
    rows = []
    for memory in sorted(memories, key=lambda m: (m.created_at, str(m.pk)), reverse=True):
        html = render_to_string(row_template, {"memory": memory, "stack": stack})
        rows.append({"id": str(memory.pk), "html": html, "created": memory.created_at.isoformat(),
                     "matches": memory.pk in listed})
    found = {str(pk) for pk in existing}
    return {"rows": rows, "removed": [i for i in ids if i not in found], "unresolved": len(existing) - len(rows)}


# --- the school overview --------------------------------------------------------------------------

def overview_message(principal: Principal, slugs: Iterable[str]) -> dict[str, Any] | None:
    """The overview's live figures after changes to `slugs`: the caller's memories stored and
    written today (what dashboard.overview computes, over `stacks_visible_to`), and the row of each
    of those stacks the caller sees. None if the caller sees none of them (another teacher's
    student): nothing is sent, not even that something changed."""
    visible = list(stacks_visible_to(principal).filter(slug__in=list(slugs))
                   .only("slug", "memory_count", "bytes_used", "last_sync_at", "last_write_at"))
    if not visible:
        return None
    totals = stacks_visible_to(principal).aggregate(memories=Sum("memory_count"))
    today = timezone.now().date()
    written = (StackDailyActivity.objects.filter(stack_id__in=stacks_visible_to(principal).values("pk"), day=today)
               .aggregate(n=Sum("written"))["n"]) or 0
    return {
        "type": "overview",
        "summary": {"memories": number_format(int(totals["memories"] or 0), force_grouping=True),
                    "written_today": number_format(int(written), force_grouping=True)},
        "stacks": [{"slug": stack.slug, **_stack_figures(stack), "last_write": _when(stack.last_write_at)}
                   for stack in visible],
    }


# --- one render for many sockets ------------------------------------------------------------------

_SHARED_MAX = 256
_shared_lock = threading.Lock()
_shared_results: OrderedDict[Any, dict[str, Any] | None] = OrderedDict()
_shared_inflight: dict[Any, threading.Lock] = {}


def _shared(key: Any, compute: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """compute() once per key in this process, however many sockets ask at once (the others wait
    for the first); the newest _SHARED_MAX results are kept."""
    with _shared_lock:
        if key in _shared_results:
            return _shared_results[key]
        key_lock = _shared_inflight.setdefault(key, threading.Lock())
    with key_lock:
        with _shared_lock:
            if key in _shared_results:
                return _shared_results[key]
        result = compute()
        with _shared_lock:
            _shared_results[key] = result
            while len(_shared_results) > _SHARED_MAX:
                _shared_results.popitem(last=False)
            _shared_inflight.pop(key, None)
    return result


# --- signals: close sockets when the session or the access ends ------------------------------------

def _notify(group: str, message_type: str) -> None:
    """Tell the sockets in `group` after the transaction commits (so their re-check reads the new
    state). A channel layer that is down must not fail a logout or a removal: the periodic re-check
    closes the sockets instead."""
    def send() -> None:
        try:
            async_to_sync(get_channel_layer().group_send)(group, {"type": message_type})
        except Exception:  # any layer failure: the periodic re-check is the safety net
            logger.warning("live sockets of %s not told about %s", group.split(".")[1], message_type, exc_info=True)

    def send_from_here() -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            send()  # the usual case: a request's or a task's thread
        else:  # a thread that runs an event loop cannot block on one: send from a helper thread
            threading.Thread(target=send, name="live-notify", daemon=True).start()

    transaction.on_commit(send_from_here)


def _on_logout(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    session = getattr(request, "session", None)
    if session is not None and session.session_key:
        _notify(session_group(session.session_key), "live.session_ended")


def _on_sessions_ended(sender: Any, user: User, **kwargs: Any) -> None:
    _notify(user_group(user.pk), "live.access_changed")


def _on_access_changed(sender: Any, instance: Membership | TeacherAssignment, **kwargs: Any) -> None:
    _notify(user_group(instance.user_id), "live.access_changed")


def connect_signals() -> None:
    """Called once from DashboardConfig.ready."""
    user_logged_out.connect(_on_logout, dispatch_uid="dashboard.live.logout")
    sessions_ended.connect(_on_sessions_ended, dispatch_uid="dashboard.live.sessions_ended")
    for model in (Membership, TeacherAssignment):
        post_delete.connect(_on_access_changed, sender=model, dispatch_uid=f"dashboard.live.delete.{model.__name__}")
        post_save.connect(_on_access_changed, sender=model, dispatch_uid=f"dashboard.live.save.{model.__name__}")
