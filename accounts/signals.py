"""Signals the accounts app sends, for other apps to act on without accounts knowing them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by accounts.services.sessions_end with `user=` once the user's sessions no longer verify (in
# the caller's transaction: a receiver acting on the new state waits for the commit). The dashboard
# closes the user's live sockets (dashboard/live.py).
sessions_ended = Signal()

# Sent by accounts.invitations.invitation_accept with `invitation=` and `member=` once the membership
# exists, inside the accepting transaction: a receiver's writes commit or roll back with it. The
# stacks app links an accepted guardian to the students the invitation names (stacks/guardians.py).
invitation_accepted = Signal()
