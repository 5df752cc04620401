"""Peers: the links between group members, the peer handshake, discovery of members,
foreign actives, and the replication wire format (``codec``) spoken over the links.

Above ``security`` and ``messaging``; imported by ``modes``, ``arbiters`` and above.
"""
