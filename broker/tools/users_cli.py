"""``tandem users`` and ``tandem acl``: the group's users and their per-queue grants.

Any member of a group takes the change and every member has it once it is confirmed
(docs/security.md).  Passwords come from a prompt, or from stdin with ``--password-stdin``;
never from the command line, where other users of the machine could read them.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Coroutine
from typing import Any

import client
from broker.security.acl import PERMISSIONS
from broker.tools.options import ExamplesFormatter, url_args
from broker.security.users import ROLES
from client.errors import InvalidArgumentError

Command = Coroutine[Any, Any, int]

_USERS_HELP = """Manage the replication group's users (the admin permission is needed). A user made on
one member logs in on every member.

roles: admin (everything), monitor (looks at everything, changes nothing), user (only what
its grants allow: tandem acl grant).

examples:
  tandem users add bob --role user            (asks for the password twice)
  printf '%s\\n' "$PW" | tandem users add ci --role user --password-stdin
  tandem users passwd bob
  tandem users list --json
  tandem users delete bob
"""

_ACL_HELP = """Grant or revoke a user's permissions on the queues whose names match PATTERN (a glob: *
any characters, ? one character). Permissions: produce (publish), consume (subscribe, get),
browse (read a stream, look without consuming), configure (declare, delete, purge), admin
(users, grants, quorum override, options; on the pattern * only); 'all' is every one.
Grants add up; a revoke takes away only what it names.

examples:
  tandem acl grant bob 'orders.*' consume
  tandem acl grant bob 'orders.*' produce,browse
  tandem acl revoke bob 'orders.*' produce
  tandem acl list bob
"""


def add_parsers(sub: Any) -> None:
    """``users ...`` and ``acl ...`` under the ``tandem`` parser."""
    users = sub.add_parser("users", help="the group's users: add, list, delete, passwd",
                           description=_USERS_HELP, formatter_class=ExamplesFormatter)
    usub = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = usub.add_parser("add", help="create a user", description="Create a user of the group.")
    add.add_argument("name")
    add.add_argument("--role", choices=ROLES, default="user",
                     help="admin, monitor or user (default: user, which may do only what grants allow)")
    _password_args(add)
    usub.add_parser("list", help="every user and its role", description="List the group's users.")
    dele = usub.add_parser("delete", help="delete a user and its grants",
                           description="Delete a user and every grant it has; its connections are closed.")
    dele.add_argument("name")
    pw = usub.add_parser("passwd", help="change a user's password", description="Give a user a new password "
                                                                                "(its role and grants stay).")
    pw.add_argument("name")
    _password_args(pw)
    for p in usub.choices.values():
        url_args(p)
        p.set_defaults(func=users_command)

    acl = sub.add_parser("acl", help="per-queue permissions: grant, revoke, list",
                         description=_ACL_HELP, formatter_class=ExamplesFormatter)
    asub = acl.add_subparsers(dest="acl_command", required=True, metavar="ACTION")
    for action, what in (("grant", "give USER PERMISSIONS on the queues matching PATTERN"),
                         ("revoke", "take PERMISSIONS on PATTERN from USER")):
        p = asub.add_parser(action, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("user")
        p.add_argument("pattern", help="queue name glob, e.g. 'orders.*' or '*' (quote it for the shell)")
        p.add_argument("permissions", help=f"comma-separated: {', '.join(PERMISSIONS)}, or all")
    ls = asub.add_parser("list", help="the grants (of USER, or of everyone)",
                         description="List the grants of USER, or of every user. A user may list its own.")
    ls.add_argument("user", nargs="?")
    for p in asub.choices.values():
        url_args(p)
        p.set_defaults(func=acl_command)


def _password_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin instead of asking for it")


def read_password(args: argparse.Namespace) -> str:
    """The new password: stdin's first line (--password-stdin) or asked for twice on the terminal."""
    if args.password_stdin:
        line = sys.stdin.readline().rstrip("\r\n")
        if not line:
            raise InvalidArgumentError("--password-stdin: stdin gave no password")
        return line
    if not sys.stdin.isatty():
        raise InvalidArgumentError("no terminal to ask for the password on: use --password-stdin")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise InvalidArgumentError("the passwords differ")
    return first


# -- users ------------------------------------------------------------------------------------


def users_command(args: argparse.Namespace) -> Command:
    password = read_password(args) if args.users_command in ("add", "passwd") else ""
    return _users(args, password)


async def _users(args: argparse.Namespace, password: str) -> int:
    cmd = args.users_command
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        if cmd == "list":
            users = await conn.list_users()
            if args.json:
                print(json.dumps([{"name": u.name, "role": u.role} for u in users]))
            else:
                width = max([4] + [len(u.name) for u in users])
                print(f"{'NAME'.ljust(width)}  ROLE")
                for u in users:
                    print(f"{u.name.ljust(width)}  {u.role}")
            return 0
        if cmd == "add":
            await conn.create_user(args.name, password, args.role)
            done: dict[str, object] = {"user": args.name, "created": True, "role": args.role}
            said = f"user {args.name} created (role {args.role}); it logs in on every member"
        elif cmd == "passwd":
            await conn.change_password(args.name, password)
            done = {"user": args.name, "password_changed": True}
            said = f"password of user {args.name} changed"
        else:
            await conn.delete_user(args.name)
            done = {"user": args.name, "deleted": True}
            said = f"user {args.name} deleted, with its grants"
    print(json.dumps(done) if args.json else said)
    return 0


# -- grants -----------------------------------------------------------------------------------


def acl_command(args: argparse.Namespace) -> Command:
    return _acl(args)


async def _acl(args: argparse.Namespace) -> int:
    cmd = args.acl_command
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        if cmd == "list":
            acls = await conn.list_acls(args.user)
            if args.json:
                print(json.dumps([{"user": a.user, "pattern": a.pattern, "permissions": a.permissions}
                                  for a in acls]))
                return 0
            rows = [("USER", "PATTERN", "PERMISSIONS")] + [(a.user, a.pattern, ",".join(a.permissions))
                                                           for a in acls]
            widths = [max(len(r[i]) for r in rows) for i in range(2)]
            for r in rows:
                print(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}")
            return 0
        perms = [p.strip() for p in args.permissions.split(",") if p.strip()]
        if cmd == "grant":
            await conn.grant(args.user, args.pattern, perms)
        else:
            await conn.revoke(args.user, args.pattern, perms)
    done = "granted" if cmd == "grant" else "revoked"
    if args.json:
        print(json.dumps({"user": args.user, "pattern": args.pattern, done: perms}))
    else:
        print(f"{done} {','.join(perms)} on {args.pattern!r} {'to' if cmd == 'grant' else 'from'} {args.user}")
    return 0
