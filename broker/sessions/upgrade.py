"""What ``tandem upgrade status`` and the console's upgrade view say of a group, read off one
node's status: each member's build, protocol versions and feature levels, the group's level,
the record types defined differently, and whether the group can be finalized now
(ha.upgrade, docs/upgrades.md)."""

from __future__ import annotations

from typing import Any

from client.protocol.frames import StatusOk
from ha.upgrade import FIRST_RELEASE, LEVELS, Build, finalize_refusal


def report(st: StatusOk) -> dict[str, Any]:
    """What ``tandem upgrade status --json`` prints for the status of one node."""
    first = not st.protocol  # (a first-release build's status says nothing of it)
    protocol = (st.protocol[0], st.protocol[1]) if len(st.protocol) == 2 else FIRST_RELEASE
    me = Build.said(st.version, protocol, st.feature_levels, st.feature_level)
    level = me.level
    members = [{"name": st.node, "build": st.version, "protocol": list(me.protocol), "levels": list(me.levels),
                "level": level, "linked": True, "this_node": True}]
    builds = {b.name: b for b in st.builds}
    up = {r.name for r in st.remotes if r.state == "Up"}
    said: dict[str, Build] = {}
    for r in st.remotes:
        b = builds.get(r.name)
        if b is None:
            members.append({"name": r.name, "build": None, "protocol": None, "levels": None, "level": None,
                            "linked": r.name in up, "this_node": False, "state": r.state})
            continue
        said[r.name] = Build(b.build, (b.protocol_min, b.protocol_max), (b.level_min, b.level_max), b.level)
        members.append({"name": r.name, "build": said[r.name].label, "protocol": [b.protocol_min, b.protocol_max],
                        "levels": [b.level_min, b.level_max], "level": b.level, "linked": b.linked,
                        "this_node": False, "state": r.state})
    target = me.levels[1]
    if first:
        why: str | None = (f"{st.node} runs build {st.version}, which has no feature levels: ask a member on a "
                           f"newer build (tandem upgrade status --url ...)")
    else:
        why = finalize_refusal(target, level, [r.name for r in st.remotes], said, up)
    mismatches = [{"member": m.member, "type": m.name, "ours": m.ours, "theirs": m.theirs, "converts": m.converts,
                   "convertible": m.convertible} for m in st.type_mismatches]
    return {"node": st.node, "build": st.version, "protocol": list(me.protocol), "feature_levels": list(me.levels),
            "feature_level": level, "level_meaning": LEVELS.get(level, ""), "members": members,
            "type_mismatches": mismatches, "type_errors": st.type_errors,
            "finalize_to": target, "finalizable": why is None, "finalize_refusal": why}
