"""The node: wiring and lifecycle.

:class:`~broker.node.node.Node` builds the subsystems, hands each the few objects it uses,
starts them, and stops them; it owns every task it spawns (``tasks``).  Beside it: the
dispatch of requests forwarded by peers (``forwarded``), the disk alarm, the heap settings.

Who may import it: ``broker.cli`` and ``broker.tools``.  It is the only package that
imports ``broker.modes``.
"""
