"""The dashboard's live sockets: `ws/stacks/<slug>/` for a student's page and `ws/school/` for the
school overview (docs/architecture.md §10, "Live pages").

Thin, like the views: who may connect and what is sent are dashboard/live.py's. Every socket has
already passed memoryhub.limits.WebsocketGuard (message rate and size), the Origin check against
ALLOWED_HOSTS and the session middleware (memoryhub/asgi.py). A handshake without a signed-in
session, or for a stack or page out of the session's reach, is refused (HTTP 403). An open socket
is closed with CLOSE_SIGNED_OUT (4401) when its session ends and CLOSE_NO_ACCESS (4403) when the
stack or school goes out of reach: at once on a signal (logout, sessions ended, membership or
assignment changed — dashboard.live.connect_signals), on any message it would render, and within
RECHECK_SECONDS whatever happened.

Messages to the client (JSON): `{"type": "change", "events": [...], "seq": n, "rows": [{"id", "html",
"created", "matches"}], "removed": [...], "unresolved": n, "counts": {...}, "total": n, "figures":
{...}, "checkpoint"?: html, "boot_config"?: html}` on the student page; `{"type": "reload"}` when a
resume is too far behind; `{"type": "overview", "summary": {...}, "stacks": [...]}` on the overview.
A student page's `seq` is gap-free: every event at or below it has been sent (live.changes_through).
The client sends nothing (anything it sends gets an `unknown_action` error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard import live
from memories.changes import watchers
from memoryhub.errors import NotFound

T = TypeVar("T")
logger = logging.getLogger(__name__)

# Overview updates for a burst of events (a class's agents syncing at once) go out together, at
# most this often per socket.
OVERVIEW_COALESCE_SECONDS = 0.2


def db(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run `func` on Django's thread for sync work with its connection returned to the pool after
    (channels' database_sync_to_async). One render serves every socket on the same event
    (dashboard.live._shared), so what each socket adds there is its access check."""
    return database_sync_to_async(func)


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """What both sockets share: the session and access checks, and closing when they fail."""

    slug: str | None = None  # the stack watched; None: the whole school (the overview)

    async def connect(self) -> None:
        user = self.scope.get("user")
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        if user is None or not user.is_authenticated or not session_key:
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.user = user
        self.session_key: str = session_key
        try:
            watched = await self.authorise()
        except NotFound:
            await self.close()
            return
        self.live_groups = [live.session_group(session_key), live.user_group(user.pk), *watched]
        # Counted before joining: the publisher sends a change only to groups someone watches
        # (memories.changes.watchers). Off the event loop: a Redis round trip.
        await sync_to_async(watchers.watch, thread_sensitive=False)(watched)
        self.watching = watched
        for group in self.live_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.after_accept()
        self.rechecker = asyncio.ensure_future(self._recheck_every())

    async def authorise(self) -> list[str]:
        """Resolve what the socket watches (NotFound: refuse); the channel-layer groups to join."""
        raise NotImplementedError

    async def after_accept(self) -> None:
        """Anything to send as soon as the socket is open."""

    async def disconnect(self, code: int) -> None:
        rechecker = getattr(self, "rechecker", None)
        if rechecker is not None:
            rechecker.cancel()
        for group in getattr(self, "live_groups", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        watching = getattr(self, "watching", [])
        if watching:
            await sync_to_async(watchers.unwatch, thread_sensitive=False)(watching)

    async def _recheck_every(self) -> None:
        while True:
            await asyncio.sleep(live.RECHECK_SECONDS)
            if await self._closed_by_recheck():
                return

    async def _closed_by_recheck(self) -> bool:
        code = await db(live.recheck)(self.session_key, self.user.pk, self.slug)
        if code is not None:
            await self.close(code)
        return code is not None

    # --- channel-layer messages (dispatched by their "type") ---

    async def live_session_ended(self, message: dict[str, Any]) -> None:
        await self.close(live.CLOSE_SIGNED_OUT)

    async def live_access_changed(self, message: dict[str, Any]) -> None:
        await self._closed_by_recheck()

    # --- from the client: nothing is expected ---

    async def receive(self, text_data: str | None = None, **kwargs: Any) -> None:
        await self.send_json({"error": {"code": "unknown_action", "message": "this socket only sends"}})


class StackConsumer(LiveConsumer):
    """A student's page: `ws/stacks/<slug>/?<the page's filters>&since=<seq>`.

    An event that changes nothing on the page (live.unseen: a vector stored) is held back up to
    live.UNSEEN_DELAY_SECONDS and goes out with the next change rendered, which covers it."""

    sent_seq = 0  # set by the catch-up right after the connect (see _catch_up)
    unseen_event: dict[str, Any] | None = None  # the newest held-back event
    unseen_sender: asyncio.Future[None] | None = None

    async def authorise(self) -> list[str]:
        self.slug = str(self.scope["url_route"]["kwargs"]["slug"])
        query = self.scope.get("query_string", b"")
        filters = live.page_filters(query)
        if filters is None:
            raise NotFound("These filters cannot be used.", code="invalid_filters")
        self.filters = filters
        self.since = live.since_of(query)
        self.sending = asyncio.Lock()  # one render at a time: each starts from the sent_seq the last reached
        _, stack = await db(live.stack_access)(self.user, self.slug)
        self.stack_id = stack.pk
        return [watchers.stack_group(stack.pk)]

    async def after_accept(self) -> None:
        message = await db(self._catch_up)()
        if message is not None:
            await self.send_json(message)

    def _catch_up(self) -> dict[str, Any] | None:
        """What the page missed after its `since` (nothing without one), and where this socket's
        live stream starts: `sent_seq`, the seq up to which the page has been sent every event."""
        principal, stack = live.stack_access(self.user, str(self.slug))
        if self.since is None:  # a page that names no seq is sent what comes after this moment
            self.sent_seq = live.stack_seq(stack)
            return None
        change, too_far = live.catch_up(stack, self.since)
        if too_far:
            self.sent_seq = live.stack_seq(stack)
            return {"type": "reload"}
        # A `since` beyond the stack's newest seq (a page older than a restored backup) must not
        # make the socket skip the events that will come below it.
        self.sent_seq = change.seq if change is not None else min(self.since, live.stack_seq(stack))
        return live.student_message(principal, stack, self.filters, change) if change is not None else None

    def _render_through(self, event: dict[str, Any], published: int) -> tuple[dict[str, Any] | None, int]:
        """The message for everything after `sent_seq` up to the event just published (see
        live.changes_through), and the seq it reaches."""
        principal, stack = live.stack_access(self.user, str(self.slug))  # still within reach? (NotFound: close)
        # An event no longer stored (pruned, its stack's data erased) is rendered from the message.
        change = live.changes_through(self.stack_id, self.sent_seq, published) or live.change_of(event)
        # The principal's grants decide which of the events' memories this socket is told about
        # (None: all of them are hidden, so it is told nothing).
        return live.student_message(principal, stack, self.filters, change), change.seq

    async def disconnect(self, code: int) -> None:
        if self.unseen_sender is not None:
            self.unseen_sender.cancel()
        await super().disconnect(code)

    async def stack_change(self, message: dict[str, Any]) -> None:
        event = message.get("event") or {}
        if event.get("stack") != self.slug:
            return  # not this stack's (the group is per stack; a slug is checked anyway)
        published = int(event["seq"])
        if live.unseen(event):
            if self.unseen_event is None or published > int(self.unseen_event["seq"]):
                self.unseen_event = event
            if self.unseen_sender is None or self.unseen_sender.done():
                self.unseen_sender = asyncio.ensure_future(self._send_unseen_later())
            return
        await self._send_through(event, published)

    async def _send_unseen_later(self) -> None:
        # Again while one is left: another may arrive during the send, and a failed send is retried.
        while self.unseen_event is not None and int(self.unseen_event["seq"]) > self.sent_seq:
            await asyncio.sleep(live.UNSEEN_DELAY_SECONDS)
            event = self.unseen_event
            try:
                if await self._send_through(event, int(event["seq"])):
                    return  # the socket was closed
            except Exception as exc:  # a task of its own: logged, and the loop tries again
                logger.warning("live page: a held-back change was not sent (%s)", type(exc).__name__)

    async def _send_through(self, event: dict[str, Any], published: int) -> bool:
        """Everything after sent_seq up to `published`, in messages; True if the socket was closed."""
        async with self.sending:
            # Not before the catch-up has set where to start: messages are handled one at a time,
            # after the connect; at or below sent_seq: sent already, with the events before it
            # (published late, or held back and covered by a later change).
            while published > self.sent_seq:
                try:
                    payload, self.sent_seq = await db(self._render_through)(event, published)
                except NotFound:
                    await self.close(live.CLOSE_NO_ACCESS)
                    return True
                if payload is not None:
                    await self.send_json(payload)
        return False


class SchoolConsumer(LiveConsumer):
    """The school overview: `ws/school/`. Events of stacks the caller does not see send nothing."""

    async def authorise(self) -> list[str]:
        principal = await db(live.staff_principal)(self.user)
        self.dirty: set[str] = set()
        self.flusher: asyncio.Future[None] | None = None
        return [watchers.school_group(principal.organization.pk)]

    async def disconnect(self, code: int) -> None:
        flusher = getattr(self, "flusher", None)
        if flusher is not None:
            flusher.cancel()
        await super().disconnect(code)

    async def stack_change(self, message: dict[str, Any]) -> None:
        slug = (message.get("event") or {}).get("stack")
        if not isinstance(slug, str):
            return
        self.dirty.add(slug)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.ensure_future(self._flush())

    def _figures(self, slugs: set[str]) -> dict[str, Any] | None:
        return live.overview_message(live.staff_principal(self.user), slugs)

    async def _flush(self) -> None:
        await asyncio.sleep(OVERVIEW_COALESCE_SECONDS)
        slugs, self.dirty = self.dirty, set()
        try:
            payload = await db(self._figures)(slugs)
        except NotFound:
            await self.close(live.CLOSE_NO_ACCESS)
            return
        if payload is not None:
            with contextlib.suppress(Exception):  # the socket closed meanwhile: nothing to deliver
                await self.send_json(payload)
