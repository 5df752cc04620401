"""The placement settings members compare as a link opens (``NodeConfig.placement_settings``:
members, replicas, sync_replicas, zones), and how two of them differ, in words."""

from __future__ import annotations


def placement_diff(mine: str, theirs: str, mine_is: str, theirs_is: str) -> str:
    """Where two placement settings (``NodeConfig.placement_settings``) differ, a clause a
    setting: "replicas 1 on node3, 2 on node1; ..." (``mine_is`` "on node3", ``theirs_is`` "on node1")."""
    here = dict(kv.partition("=")[::2] for kv in mine.split(" "))
    there = dict(kv.partition("=")[::2] for kv in theirs.split(" "))
    return "; ".join(f"{k} {here.get(k) or '(none)'} {mine_is}, {there.get(k) or '(none)'} {theirs_is}"
                     for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k))


def placement_mismatch(mine: str, theirs: str, me: str, peer: str) -> str:
    """How ``peer``'s placement settings differ from this node's ("" when they agree, or when
    either side places nothing: a witness)."""
    if not mine or not theirs or theirs == mine:
        return ""
    if "group=" in mine or "group=" in theirs:
        # the members changed while the group ran (broker.partitions.members): members and zones are the
        # group's state, which a member behind learns over this very link; the rest must agree
        here = dict(kv.partition("=")[::2] for kv in mine.split(" "))
        there = dict(kv.partition("=")[::2] for kv in theirs.split(" "))
        keep = ("replicas", "sync_replicas")
        mine = " ".join(f"{k}={here.get(k, '')}" for k in keep)
        theirs = " ".join(f"{k}={there.get(k, '')}" for k in keep)
        if mine == theirs:
            return ""
    return ("placement settings differ, so the two would place partitions on different nodes: "
            + placement_diff(mine, theirs, f"on {me}", f"on {peer}")
            + " (give every member the same peers, replicas, sync_replicas and zones)")
