"""The node process: client listener, sessions, queues, routing, peer links, lifecycle, CLI."""

__version__ = "0.11.0"
