"""Shared mode: the lease-holder's loop and its commit path (``mode``)."""
