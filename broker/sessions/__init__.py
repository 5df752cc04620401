"""Client sessions: the session shell and its handlers, and the status reports.

Above ``partitions``: a session may call partition operations, messaging, security and
peers.  Imported by ``broker.node`` and the console.
"""
