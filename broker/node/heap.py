"""A node's C heap (glibc's malloc): two arenas, and freed memory handed back to the system.

glibc gives each thread that allocates its own malloc arena, up to eight per core. A node's
threads (the event loop, the store's writer and readers) allocate and free message batches
in turn, and what one arena frees stays mapped: in the hour-long soak a node restarted after a
kill came back at ~200 MiB against its peers' ~130, without a single more Python object
(``sys.getallocatedblocks()`` flat). With two arenas it came back at the peers' level.
:func:`trim` (``malloc_trim``) also returns the free pages inside the heap, which a takeover's
burst of allocations leaves behind; the node calls it once a minute off the event loop.

Elsewhere (musl, macOS, Windows) both are no-ops.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger("tandem.broker")

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
ARENAS = 2
TRIM_EVERY = 60.0  # seconds between two trims of a running node


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _glibc()


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let malloc keep at most ``arenas`` arenas (call it before the node starts its
    threads); False where that is not glibc's to say."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(M_ARENA_MAX, arenas))
    if not ok:
        log.debug("mallopt(M_ARENA_MAX, %d) refused", arenas)
    return ok


def trim() -> bool:
    """Hand free heap memory back to the system (``malloc_trim(0)``); whether any was."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))
