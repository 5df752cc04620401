"""Operator tools around the node: local groups, fault injection, drills and benchmarks.

Nothing here runs inside a node.  ``broker.cli`` (the ``tandem`` command) wires them in:

* :mod:`broker.tools.commands`, :mod:`broker.tools.status`: the client commands;
* :mod:`broker.tools.process`, :mod:`broker.tools.cluster`: node processes and local groups
  (``tandem cluster up``, tests, drills, benchmarks);
* :mod:`broker.tools.faults`, :mod:`broker.tools.checker`, :mod:`broker.tools.drill`:
  fault injection and the failover drills;
* :mod:`broker.tools.bench`: ``tandem bench``, side by side with RabbitMQ and NATS.
"""
