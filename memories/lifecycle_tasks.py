"""Periodic lifecycle tasks (decay, expiry, promotion); filled in by the decay issue."""
