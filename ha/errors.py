"""Errors of the HA state machines."""

from __future__ import annotations


class IllegalTransition(Exception):
    """An event a state machine's transition table has no entry for: a bug in the caller."""
