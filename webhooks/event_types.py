"""Webhook event types: how a change event's (topic, action) is named for integrators.

The names are past tense ("memory.created"), the way integrators' APIs usually name what happened;
the raw topic, action and source are in the payload's `data` too. An action this table does not know
yet (a write path added later) is still delivered, as "<topic>.<action>", to "*" subscribers.
"""

from __future__ import annotations

ALL = "*"
TEST = "webhook.test"  # the dashboard's "Send test event"; delivered whatever an endpoint subscribes to

_NAMES = {
    ("memory", "create"): "memory.created",
    ("memory", "update"): "memory.updated",
    ("memory", "forget"): "memory.forgotten",
    ("memory", "recover"): "memory.recovered",
    ("memory", "protect"): "memory.protected",
    ("memory", "unprotect"): "memory.unprotected",
    ("memory", "delete"): "memory.deleted",
    # A TTL purge or erasure removes rows: for an integrator that is a deletion (data.action says which).
    ("memory", "purge"): "memory.deleted",
    ("memory", "erase"): "memory.deleted",
    ("memory", "embedded"): "memory.embedded",
    ("checkpoint", "save"): "checkpoint.saved",
    ("boot_config", "set"): "boot_config.changed",
    ("boot_config", "unset"): "boot_config.changed",
    # One write that did several things to a stack's memories (a push that creates, updates and
    # forgets): one event, so one delivery, to every endpoint that wants any memory.* type.
    ("memory", "batch"): "memory.batch",
}
BATCH = "memory.batch"

# What an endpoint may subscribe to, in the order the dashboard offers them.
EVENT_TYPES: tuple[tuple[str, str], ...] = (
    (ALL, "All events (*), including kinds added later"),
    ("memory.created", "memory.created"),
    ("memory.updated", "memory.updated"),
    ("memory.forgotten", "memory.forgotten"),
    ("memory.recovered", "memory.recovered"),
    ("memory.protected", "memory.protected"),
    ("memory.unprotected", "memory.unprotected"),
    ("memory.deleted", "memory.deleted"),
    ("memory.embedded", "memory.embedded"),
    (BATCH, "memory.batch (one write that did several of the above)"),
    ("checkpoint.saved", "checkpoint.saved"),
    ("boot_config.changed", "boot_config.changed"),
)


def event_type(topic: str, action: str) -> str:
    return _NAMES.get((topic, action), f"{topic}.{action}")


def subscribed(event_types: list[str], name: str) -> bool:
    """Does a subscription list want this event type? ("*" wants everything; a mixed memory write
    goes to anyone who wants some memory.* type, since it may contain what they want.)"""
    if ALL in event_types or name in event_types:
        return True
    return name == BATCH and any(wanted.startswith("memory.") for wanted in event_types)
