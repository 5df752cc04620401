"""``tandem witness start``: run a two-node group's witness (:mod:`broker.arbiters.witness`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from broker.config import ConfigError, parse_peer

DESCRIPTION = """\
Run the witness of a two-node replicated group: a third voter that holds no messages.

Both data nodes name it in their settings (arbiter = "witness", witness = "NAME=HOST:PORT",
or --arbiter witness --witness NAME=HOST:PORT). With its vote, either data node can be
elected when the other is gone (a majority of three), and never both: nothing confirmed is
lost and a partition never has two actives. The witness keeps only terms, votes and the
positions of log entries (never their data) in DATA_DIR/witness.db, fsynced before it
answers; it is never active and serves no clients. Run it on a third machine: a small one
will do. It proves the group secret on every peer link, as the data nodes do: give it a copy
of their cluster_secret_file (--cluster-secret-file).

What the group survives: the loss of either data node, or of the witness, one at a time.
Losing the active after the other data node was already down leaves the group unavailable
(nothing lost) until that node is back. Never wipe the witness's data dir while a data node
is down.
"""


def add_parser(sub: Any) -> None:
    """``witness start`` under the ``tandem`` parser."""
    w = sub.add_parser("witness", help="run a two-node group's witness (a data-less third vote)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    wsub = w.add_subparsers(dest="witness_command", required=True, metavar="ACTION")
    start = wsub.add_parser("start", help="start the witness in the foreground", description=DESCRIPTION,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    start.add_argument("--name", required=True, help="the witness's name, as the data nodes' witness setting has it")
    start.add_argument("--peer-port", dest="peer_port", type=int, required=True,
                       help="port for the peer links (the port in the data nodes' witness setting)")
    start.add_argument("--peers", required=True, metavar="NAME=HOST:PORT,NAME=HOST:PORT",
                       help="the two data nodes and their peer ports")
    start.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    start.add_argument("--data-dir", dest="data_dir", help="where the votes are kept (default .tandem/NAME)")
    start.add_argument("--keepalive-interval", dest="keepalive_interval", type=float, default=0.25,
                       help="seconds between keep-alives on peer links (default 0.25; as the data nodes')")
    start.add_argument("--non-response-timeout", dest="non_response_timeout", type=float, default=1.0,
                       help="seconds of silence before a peer is Down (default 1.0; as the data nodes')")
    start.add_argument("--cluster-secret-file", dest="cluster_secret_file", metavar="PATH",
                       help="the group secret the data nodes hold (a copy of their cluster_secret_file; "
                            "`tandem secret new PATH` makes one): the witness proves it on every peer link")
    start.add_argument("--tls-cert", dest="tls_cert", metavar="PEM",
                       help="the witness's certificate (with --tls-key and --tls-ca): TLS on its peer links, "
                            "as the data nodes' --tls-cert")
    start.add_argument("--tls-key", dest="tls_key", metavar="PEM", help="the private key of --tls-cert")
    start.add_argument("--tls-ca", dest="tls_ca", metavar="PEM",
                       help="the CA certificate the data nodes' certificates are signed by")
    start.add_argument("--peer-tls", dest="peer_tls", choices=("auto", "on", "off"), default="auto",
                       help="TLS on peer links: auto (on with --tls-cert; default), on, or off (plaintext, "
                            "a warning); as the data nodes'")
    start.set_defaults(func=_start, default_log_level="INFO")


def _start(args: argparse.Namespace) -> Any:
    from broker.arbiters.witness import WitnessConfig

    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    for p in peers:
        try:
            parse_peer(p)
        except ConfigError:
            raise ConfigError(f"--peers: {p!r} is not NAME=HOST:PORT") from None
    if not 0 <= args.peer_port <= 65535:
        raise ConfigError(f"--peer-port {args.peer_port}: must be 0..65535")
    data_dir = Path(args.data_dir) if args.data_dir else Path(".tandem") / args.name
    cfg = WitnessConfig(name=args.name, peer_port=args.peer_port, peers=peers, host=args.host, data_dir=data_dir,
                        keepalive_interval=args.keepalive_interval, non_response_timeout=args.non_response_timeout,
                        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
                        tls_key=Path(args.tls_key) if args.tls_key else None,
                        tls_ca=Path(args.tls_ca) if args.tls_ca else None, peer_tls=args.peer_tls,
                        cluster_secret_file=Path(args.cluster_secret_file) if args.cluster_secret_file else None)
    return _serve(cfg)


async def _serve(cfg: Any) -> int:
    from broker.arbiters.witness import Witness

    w = Witness(cfg)
    await w.start()
    stop = asyncio.Event()  # (handled from the moment it says it is up)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host, port = w.peers.address if w.peers is not None and w.peers.address else (cfg.host, cfg.peer_port)
    print(f"Tandem witness {cfg.name} is up", flush=True)
    print(f"  peer address : {host}:{port}", flush=True)
    print(f"  data nodes   : {', '.join(cfg.peers)}", flush=True)
    print(f"  votes        : {cfg.data_dir / 'witness.db'}", flush=True)
    print("  stop with Ctrl-C or SIGTERM", flush=True)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(w.failed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for t in waits:
        t.cancel()
    if not w.failed.is_set():
        logging.getLogger("tandem.ha.witness").info("signal received: shutting down")
    await w.stop()
    return 1 if w.failed.is_set() else 0
