"""Security: logins (SCRAM), users, grants (ACLs), the group secret, TLS, intruder
lockout, and the standing a session's login rests on.

Above ``messaging`` (it commits user and grant changes through the catalogue's commit
seam); everything above ``security`` may import it.
"""
