"""From change events to deliveries, and from deliveries to receivers (docs/webhooks.md "A delivery",
"Retries, ordering and disabling").

* `fan_out(event)` is the change-event consumer (registered in apps.py): it only INSERTs one
  pending delivery per subscribed endpoint of the event's own school (unique per endpoint and
  event, so the relay calling it again records nothing twice) and, after commit, queues the
  sender task. No HTTP here: it runs right after a write commits.
* `queue_run(endpoint, stack)` (the Celery task webhooks.deliver) sends one endpoint's pending
  deliveries of one stack oldest first (by the event's seq). The request is made outside any
  transaction, under a short lease on the row (`claimed_until`, CLAIM): the sender renews it every
  RENEW_SECONDS while it waits on the receiver, so a live slow delivery is never taken over, and a
  delivery whose worker died (kill -9: nothing released it) is free again within CLAIM. The lease
  value is also the sender's fencing token: a renewal or an outcome is only written while the row
  still carries the value this sender set, so a sender that lost its lease (a long pause) records
  nothing over the worker that took the delivery over. A failed attempt is retried with exponential
  back-off (10 s, 30 s, 90 s, … at most an hour apart) and blocks the stack's later deliveries
  until it succeeds or, 24 hours after it was recorded, is given up (`failed`). An endpoint whose
  attempts have all failed for 24 hours is disabled, audited, and its school's admins are told.
* `sweep()` (beat, every 10 s) re-queues a queue whose head's lease lapsed (its sender died) at
  once, and a due head nobody claimed once it has waited SWEEP_GRACE (its task message was lost;
  a younger one is most likely still in the broker's queue, and re-queuing it would only pile up
  duplicate tasks behind a backlog).
* `payload(delivery, endpoint)` builds the body at send time. An endpoint is never a stack's own
  credentials, so its privacy grants apply (memories.privacy.grants: `webhook:<endpoint id>`,
  `role:webhook`, `org:<school>`, `*`): the event's memory ids are narrowed in one SQL query to
  the memories whose current grants admit the endpoint, before the body lists any id or text.
* An event whose memories are all hidden from an endpoint is never announced to it: `fan_out`
  records no delivery for that endpoint, and if the grants changed between recording and sending,
  the pending delivery is dropped (deleted, not sent) at send time. "Hidden" means the memory still
  exists and its grants do not admit the endpoint; an event about memories gone for good (an
  erasure, a purge) has no grants left to read and is announced with the ids narrowed away.

`clock` and `enqueue` are module attributes so tests can move time and run the task in-process.
"""

from __future__ import annotations

import contextvars
import json
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from celery import current_app
from django.core.mail import send_mail
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.authors import Author
from accounts.models import Membership, Organization
from accounts.services import audit_record
from memories.changes.feed import event_dict
from memories.models import ChangeEvent, Memory
from memories.privacy.grants import audience_for_webhook, grants_filter
from memories.reads.access_log import AccessPath, record_access
from memoryhub.metrics import WEBHOOK_DELIVERIES
from stacks.models import Stack
from webhooks import event_types
from webhooks.delivery import Outcome, post
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.sealing import SecretUnreadable, unseal

logger = logging.getLogger(__name__)

DELIVER_TASK = "webhooks.deliver"  # webhooks.tasks.deliver_task
RETRY_WINDOW = timedelta(hours=24)  # a delivery is retried this long; an endpoint failing this long is disabled
FIRST_RETRY_SECONDS = 10
BACKOFF_FACTOR = 3
MAX_RETRY_SECONDS = 3600
# A sender's lease on the delivery it is sending, renewed every RENEW_SECONDS while the request is
# in flight (a request has no overall bound: delivery.TIMEOUT_SECONDS is per connect/read/write).
# Short, so a killed worker's delivery is retaken by the next sweep within seconds; two
# missed renewals still leave it held.
CLAIM = timedelta(seconds=15)
RENEW_SECONDS = 5.0
SWEEP_GRACE = timedelta(seconds=30)  # a due head nobody claimed is re-queued by the sweep after this
BATCH = 50  # deliveries one task run sends before handing over to a fresh task
MAX_MEMORIES_WITH_TEXT = 500  # memories listed with text in one payload; more → "memories_truncated"

clock: Callable[[], datetime] = timezone.now


def _send_task(endpoint_id: int, stack_id: int | None, countdown: float = 0) -> None:
    try:
        current_app.send_task(DELIVER_TASK, args=[endpoint_id, stack_id], countdown=max(countdown, 0) or None)
    except Exception:  # broker down: the sweep re-queues due deliveries
        logger.warning("webhooks: could not queue a delivery task for endpoint %s", endpoint_id, exc_info=True)


enqueue: Callable[..., None] = _send_task


def retry_delay(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: 10 s, 30 s, 90 s, 4.5 min, … capped at an hour."""
    return timedelta(seconds=min(FIRST_RETRY_SECONDS * BACKOFF_FACTOR ** max(attempts - 1, 0), MAX_RETRY_SECONDS))


# --- fan-out -------------------------------------------------------------------------------------


def fan_out(event: ChangeEvent) -> int:
    """Record a pending delivery of `event` for each subscribed, enabled endpoint of the event's
    stack's school; return how many endpoints it matched. Idempotent (the relay may call it again)."""
    name = event_types.event_type(event.topic, event.action)
    # The publisher hands over the stack's school and slug with the event (memories.changes.publish._event_of);
    # otherwise (a relay of an older shape, a test's row) they are looked up. Only this school's endpoints.
    organization_id = getattr(event, "organization_id", None)
    slug = getattr(event, "stack_slug", None)
    if organization_id is None or slug is None:
        organization_id, slug = Stack.objects.values_list("organization_id", "slug").get(pk=event.stack_id)
    endpoints = [endpoint for endpoint in _enabled_endpoints(organization_id)
                 if event_types.subscribed(endpoint.event_types, name)]
    if not endpoints:
        return 0
    data = event_dict(event, slug)
    # Not even the fact of a change goes to an endpoint whose grants hide every memory it names.
    endpoints = _admitting(endpoints, event.stack_id, data["memory_ids"], organization_id)
    if not endpoints:
        return 0
    now = clock()
    WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint_id=endpoint.pk, stack_id=event.stack_id, event_id=event.pk, seq=event.seq,
                        event_type=name, data=data, next_attempt_at=now, created_at=now)
        for endpoint in endpoints
    ], ignore_conflicts=True)
    for endpoint in endpoints:
        transaction.on_commit(partial(enqueue, endpoint.pk, event.stack_id))
    return len(endpoints)


class _Subscriber(NamedTuple):
    """What the fan-out reads of an enabled endpoint."""

    pk: int
    public_id: str
    event_types: list[str]


# Written out: it runs once per change event, in the web processes right after their writes and in
# the workers after each batch of stored vectors, and compiling the queryset cost more than running it
# (docs/benchmarks.md "Figures behind code choices"). Django loads jsonb as text: decoded here as the
# JSONField would. tests/webhooks/test_delivery.py covers what it must select: enabled endpoints of
# the event's school, by their subscriptions.
_ENABLED_ENDPOINTS_SQL = (f'SELECT id, public_id, event_types FROM "{WebhookEndpoint._meta.db_table}"'  # noqa: S608
                          " WHERE organization_id = %s AND enabled ORDER BY id")  # (the model's table name only)


# The fan-out's condition for the change-event publisher (memories.writes.effects): it is called
# only for events of a school with an enabled endpoint, answered in the statement that claims the
# events, so a school without webhooks (most) costs the publisher no statement here.
WANTED_IF_SQL = (f'EXISTS (SELECT 1 FROM "{WebhookEndpoint._meta.db_table}" w'  # noqa: S608 - the table name only
                 " WHERE w.organization_id = s.organization_id AND w.enabled)")


def _enabled_endpoints(organization_id: int) -> list[_Subscriber]:
    with connection.cursor() as cursor:
        cursor.execute(_ENABLED_ENDPOINTS_SQL, [organization_id])
        return [_Subscriber(pk, public_id, json.loads(types) if isinstance(types, str) else types)
                for pk, public_id, types in cursor.fetchall()]


def _admitting(endpoints: list[_Subscriber], stack_id: int, named: list[str],
               organization_id: int) -> list[_Subscriber]:
    """The endpoints that may hear of an event naming `named`: all of them, unless every name is a
    memory that still exists, and then those whose grants admit at least one (one SQL query each,
    through the grants predicate builder). An event naming no memory, a name that is not a UUID, or
    only memories gone for good (no grants left to read) hides nothing."""
    if not named or not all(_is_uuid(memory_id) for memory_id in named):
        return endpoints
    stored = Memory.objects.filter(stack_id=stack_id, pk__in=named)
    if not stored.exists():
        return endpoints
    organization = Organization.objects.get(pk=organization_id)
    return [endpoint for endpoint in endpoints if grants_filter(stored, audience_for_webhook(
        endpoint_public_id=endpoint.public_id, organization=organization)).exists()]


def consume_event(event: ChangeEvent) -> None:
    """The change-event consumer memories.changes.publish calls (registered in apps.py)."""
    fan_out(event)


# --- sending -------------------------------------------------------------------------------------


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def payload(delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> dict[str, Any] | None:
    """The body to send, or None when every memory the event names still exists and the endpoint's
    current grants admit none of them: then nothing is sent (module doc)."""
    data = delivery.data
    rows: list[dict[str, Any]] = []
    if delivery.stack_id is not None and data.get("memory_ids"):
        # The endpoint's grants, in SQL, over this delivery's stack only (so only this school): an id
        # of a memory they do not admit - or of one gone for good, whose grants cannot be read - is
        # left out of `data.memory_ids` and `memories` alike.
        audience = audience_for_webhook(endpoint_public_id=endpoint.public_id, organization=endpoint.organization)
        named = [str(memory_id) for memory_id in data["memory_ids"]]
        wanted = [memory_id for memory_id in named if _is_uuid(memory_id)]
        columns = ("id", "kind", "text", "forgotten_at", "deleted_at") if endpoint.include_text else ("id",)
        rows = list(grants_filter(Memory.objects.filter(stack_id=delivery.stack_id, pk__in=wanted), audience)
                    .values(*columns))
        # A name that is not a UUID is no memory's id (memories are keyed by UUIDs): there is nothing
        # behind it for a grant to hide, so it stays as the event named it.
        admitted = {str(row["id"]) for row in rows} | {memory_id for memory_id in named if not _is_uuid(memory_id)}
        if not admitted and Memory.objects.filter(stack_id=delivery.stack_id, pk__in=wanted).exists():
            return None  # all hidden (the grants changed after the fan-out recorded it)
        data = {**data, "memory_ids": [memory_id for memory_id in named if memory_id in admitted]}
    body: dict[str, Any] = {
        "id": delivery.public_id,
        "type": delivery.event_type,
        "created_at": delivery.created_at.isoformat(),
        "school": endpoint.organization.public_id,
        "data": data,
    }
    if endpoint.include_text and delivery.stack_id is not None:
        ids = list(data.get("memory_ids") or [])
        # Only what is still stored: a forgotten or deleted memory is listed without its text. The
        # text is the memory's current text.
        found = {str(row["id"]): row for row in rows}
        memories = []
        for memory_id in ids[:MAX_MEMORIES_WITH_TEXT]:
            row = found.get(memory_id)
            entry: dict[str, Any] = {"id": memory_id, "kind": row["kind"] if row else None}
            if row and row["forgotten_at"] is None and row["deleted_at"] is None:
                entry["text"] = row["text"]
            memories.append(entry)
        body["memories"] = memories
        if len(ids) > MAX_MEMORIES_WITH_TEXT:
            body["memories_truncated"] = True
    return body


def _head(endpoint_id: int, stack_id: int | None) -> WebhookDelivery | None:
    queue = Q(stack__isnull=True) if stack_id is None else Q(stack_id=stack_id)
    return (WebhookDelivery.objects.filter(queue, endpoint_id=endpoint_id, status=WebhookDelivery.Status.PENDING)
            .order_by("seq", "event_id", "pk").first())


def _attempt(endpoint: WebhookEndpoint, delivery: WebhookDelivery, content: dict[str, Any]) -> Outcome:
    try:
        secret = unseal(endpoint.secret_sealed)
    except SecretUnreadable:
        return Outcome(None, "secret unreadable: rotate the endpoint's secret")
    body = json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()
    event_id = str(delivery.event_id) if delivery.event_id is not None else delivery.public_id
    return post(endpoint.url, body=body, secret=secret, event_id=event_id, attempt=delivery.attempts + 1)


def claim(delivery: WebhookDelivery, now: datetime) -> datetime | None:
    """Take the lease on `delivery` (pending, unchanged since read, and not held or its lease lapsed);
    return the lease's end, which is also this sender's token for renewing and recording, or None
    when another sender holds it."""
    until = now + CLAIM
    claimed = (WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDelivery.Status.PENDING,
                                              attempts=delivery.attempts)
               .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
               .update(claimed_until=until))
    return until if claimed else None


def renew(delivery_id: int, held: datetime) -> datetime | None:
    """Extend our lease (the row still carries `held`, the value we set) to CLAIM from now; return the
    new value, or None when the lease was lost (it lapsed and another sender took the delivery)."""
    until = clock() + CLAIM
    try:
        renewed = WebhookDelivery.objects.filter(pk=delivery_id, status=WebhookDelivery.Status.PENDING,
                                                 claimed_until=held).update(claimed_until=until)
    except DatabaseError as error:  # the lease may lapse meanwhile: at worst the delivery is sent twice
        logger.warning("webhooks: lease of delivery %s not renewed (%s)", delivery_id, type(error).__name__)
        return held
    return until if renewed else None


def _attempt_leased(endpoint: WebhookEndpoint, delivery: WebhookDelivery, content: dict[str, Any],
                    lease: datetime) -> tuple[Outcome, datetime | None]:
    """Make the attempt while keeping the lease: the request runs on a helper thread (it needs no
    database) and this thread, which owns the task's database connection, renews the lease every
    RENEW_SECONDS until the answer is in. Returns the outcome and the lease still held (None: lost)."""
    held: datetime | None = lease
    context = contextvars.copy_context()  # the request id of the logs follows the request
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-send") as sender:
        answer = sender.submit(context.run, _attempt, endpoint, delivery, content)
        while True:
            try:
                return answer.result(timeout=RENEW_SECONDS), held
            except TimeoutError:  # still waiting on the receiver
                if held is not None:
                    held = renew(delivery.pk, held)
                    if held is None:
                        logger.warning("webhooks: lease of delivery %s lost while sending; another worker took it",
                                       delivery.public_id)


def queue_run(endpoint_id: int, stack_id: int | None) -> int:
    """Send the due head deliveries of one (endpoint, stack) queue in order; return how many were
    delivered. Stops at a failure (its retry is queued) or at a delivery not yet due."""
    delivered = 0
    for _ in range(BATCH):
        endpoint = WebhookEndpoint.objects.select_related("organization").filter(pk=endpoint_id).first()
        if endpoint is None or not endpoint.enabled:
            return delivered
        head = _head(endpoint_id, stack_id)
        now = clock()
        if head is None or head.next_attempt_at > now:
            return delivered
        lease = claim(head, now)
        if lease is None:
            return delivered  # another worker is sending it; it carries the queue on
        content = payload(head, endpoint)
        if content is None:  # every memory it names is now hidden from this endpoint: no delivery at all
            WebhookDelivery.objects.filter(pk=head.pk, status=WebhookDelivery.Status.PENDING,
                                           claimed_until=lease).delete()
            continue
        outcome, lease = _attempt_leased(endpoint, head, content, lease)  # HTTP: no transaction is open here
        if outcome.status_code is not None:  # the receiver got the body, whatever it answered
            _record_served(endpoint, head, content)
        if lease is None:
            return delivered  # lease lost mid-request: the worker that took the delivery over carries on
        if outcome.ok:
            if not _record_success(endpoint, head, outcome, lease):
                return delivered
            delivered += 1
            continue
        if not _record_failure(endpoint, head, outcome, lease):
            return delivered  # retry queued; later deliveries of the stack wait for it
    enqueue(endpoint_id, stack_id)  # more to send: a fresh task, so one busy queue does not hog a worker
    return delivered


def _record_served(endpoint: WebhookEndpoint, delivery: WebhookDelivery, content: dict[str, Any]) -> None:
    """The access log's row for a body that carried memory text (docs/privacy.md "Access log"): the
    reader is the endpoint; a body of ids only served no content and records nothing."""
    served = [entry["id"] for entry in content.get("memories", ()) if "text" in entry]
    if delivery.stack_id is not None and served:
        record_access(stack_id=delivery.stack_id, path=AccessPath.WEBHOOK, memory_ids=served,
                      author=Author(path=AccessPath.WEBHOOK, key_id=endpoint.public_id,
                                    key_name=endpoint.description))


def _held(delivery: WebhookDelivery, lease: datetime) -> Any:
    """The delivery's row while it still carries our lease (an outcome is written only then)."""
    return WebhookDelivery.objects.filter(pk=delivery.pk, status=WebhookDelivery.Status.PENDING, claimed_until=lease)


def _record_success(endpoint: WebhookEndpoint, delivery: WebhookDelivery, outcome: Outcome,
                    lease: datetime) -> bool:
    """Record a delivered attempt; False if the lease was lost (the new holder records its own)."""
    now = clock()
    if not _held(delivery, lease).update(
            status=WebhookDelivery.Status.DELIVERED, attempts=delivery.attempts + 1,
            last_status_code=outcome.status_code, last_error="", finished_at=now, claimed_until=None):
        return False
    WEBHOOK_DELIVERIES.labels("delivered").inc()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=None, last_attempt_at=now, last_status_code=outcome.status_code, last_attempt_ok=True)
    return True


def _record_failure(endpoint: WebhookEndpoint, delivery: WebhookDelivery, outcome: Outcome,
                    lease: datetime) -> bool:
    """Record a failed attempt; True if the delivery was given up (the queue may move on). False too
    when the lease was lost: the worker holding it now records its own attempt and carries on."""
    now = clock()
    attempts = delivery.attempts + 1
    given_up = now - delivery.created_at >= RETRY_WINDOW
    next_at = now + retry_delay(attempts)
    if not _held(delivery, lease).update(
            status=WebhookDelivery.Status.FAILED if given_up else WebhookDelivery.Status.PENDING,
            attempts=attempts, last_status_code=outcome.status_code, last_error=outcome.error[:200],
            next_attempt_at=next_at, finished_at=now if given_up else None, claimed_until=None):
        return False
    WEBHOOK_DELIVERIES.labels("failed").inc()
    WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(failing_since=now)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        last_attempt_at=now, last_status_code=outcome.status_code, last_attempt_ok=False)
    endpoint.refresh_from_db(fields=["failing_since"])
    if endpoint.failing_since is not None and now - endpoint.failing_since >= RETRY_WINDOW:
        _disable_failing(endpoint, now)
        return True
    logger.info("webhooks: delivery %s to endpoint %s failed (attempt %s, %s)", delivery.public_id,
                endpoint.public_id, attempts, outcome.error or outcome.status_code)
    if not given_up:
        enqueue(endpoint.pk, delivery.stack_id, countdown=(next_at - now).total_seconds())
    return given_up


def _disable_failing(endpoint: WebhookEndpoint, now: datetime) -> None:
    disabled = WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
        enabled=False, disabled_reason=WebhookEndpoint.DisabledReason.FAILING, disabled_at=now)
    if not disabled:
        return
    since = endpoint.failing_since
    audit_record(organization=endpoint.organization, action="webhook.disabled", target_type="webhook",
                 target_id=endpoint.public_id,
                 metadata={"reason": "failing", "failing_since": since.isoformat() if since else None})
    logger.warning("webhooks: endpoint %s disabled after failing for 24 hours", endpoint.public_id)
    _tell_admins(endpoint)


def _tell_admins(endpoint: WebhookEndpoint) -> None:
    emails = sorted({email for email in Membership.objects.filter(
        organization=endpoint.organization, role=Membership.Role.ADMIN).values_list("user__email", flat=True)
        if email})
    if not emails:
        return
    shown = endpoint.url.split("?", 1)[0]  # a query string may carry a token: keep it out of mail
    body = (f"MemoryHub could not deliver webhooks to {shown} for 24 hours, so this endpoint "
            f"({endpoint.public_id}) has been disabled and receives no new events.\n\n"
            "Fix the receiver, then enable the endpoint again on the dashboard's Webhooks page and use "
            "\"Send test event\" to check it.\n")
    try:
        send_mail(f"{endpoint.organization.name}: a webhook endpoint was disabled", body, None, emails)
    except Exception:  # the audit event and the dashboard still tell them
        logger.warning("webhooks: could not mail the admins about endpoint %s", endpoint.public_id, exc_info=True)


# --- the sweep -----------------------------------------------------------------------------------


def sweep() -> int:
    """Queue a task for every (endpoint, stack) whose head is due and not being sent: at once when
    its sender's lease lapsed (the sender died), after SWEEP_GRACE when nobody claimed it (module doc)."""
    now = clock()
    queues = (WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now,
                                             endpoint__enabled=True)
              .filter(Q(claimed_until__lt=now) | Q(claimed_until__isnull=True, next_attempt_at__lte=now - SWEEP_GRACE))
              .values_list("endpoint_id", "stack_id").distinct()[:1000])
    count = 0
    for endpoint_id, stack_id in queues:
        enqueue(endpoint_id, stack_id)
        count += 1
    return count
