"""Names ``broker.node`` imports from here: the console it starts, and the status helpers
it answers its peers with (which live in :mod:`broker.status`).

Temporary: delete this module once the entry point builds the console
(:func:`webconsole.app.serve_console`) and ``broker.node`` imports the helpers from
:mod:`broker.status`.
"""

from broker.status import apply_option, pstats_payload, queue_counters
from webconsole.app import Console

__all__ = ["Console", "apply_option", "pstats_payload", "queue_counters"]
