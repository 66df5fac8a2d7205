"""The shared read-only ("trusted") connections to the built databases.

Gold SQL, value pools and private copies read the shared files through these connections only
(``mode=ro`` URI, ``query_only``); agent SQL never runs on them. One connection per file and
process, serialised by :data:`TRUSTED_LOCK` (environments may live in threads).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from functools import cache
from pathlib import Path

from entropace.envs.db.build import database_path

#: Serialises use of the shared trusted connections (environments may live in threads).
TRUSTED_LOCK = threading.RLock()


def trusted_connection(database: str) -> sqlite3.Connection:
    """A read-only connection (no authorizer) for gold SQL and pools; one per file and process.

    Keyed by process id too: a connection must not be used across ``fork``.
    """
    return _open_trusted(str(database_path(database)), os.getpid())


@cache
def _open_trusted(path: str, pid: int) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    return conn
