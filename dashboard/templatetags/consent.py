"""`{% consent_of stack as consent %}`: a student's consent and pause as the panels show them
(memories.governance.consent.consent_state), so a page that includes a consent panel needs nothing
from its view (docs/consent.md "Dashboard")."""

from __future__ import annotations

from django import template

from memories.governance.consent import ConsentState, consent_state
from stacks.models import Stack

register = template.Library()


@register.simple_tag
def consent_of(stack: Stack) -> ConsentState:
    return consent_state(stack)
