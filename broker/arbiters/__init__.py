"""Arbiters of a two-member group: the LockFile (``lockfile``, ``lockrecord``) and the witness
(``witness``).

Beside ``modes`` (neither imports the other), above ``peers``; imported by ``broker.node``.
"""
