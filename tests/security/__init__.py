"""Security tests against real node processes: what an attacker on the network learns and
what it can make a node write."""
