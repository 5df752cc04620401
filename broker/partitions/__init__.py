"""Partition operations: moves, group membership changes, remaps, drains, restore,
quarantine and the compensation hooks restore asks.

Above ``modes``, ``arbiters``, ``peers``, ``security`` and ``messaging``; imported by
``sessions`` and ``node``.
"""
