"""PostgreSQL notifications as events for control scripts.

The schema NOTIFYs on three channels, always with names, never with rows:

Topologies are named by their key: ``namespace/name`` for a topology of a
namespace, else the bare name.

* ``nextmini_topology``: payload ``<topology>``, the desired state changed (new generation);
  or ``<topology> problems=<n>``, the hub's list of stored rows it cannot run as written
  changed (``nextmini status`` shows them);
* ``nextmini_metrics``: payload ``<topology>``, a batch of link metrics was stored;
* ``nextmini_nodes``: payload ``<topology>/<node> <state>``, an agent's stream changed state.

A notification only says "look again"; scripts then read the state they need.
LISTEN lives on its own autocommit connection: a notification is delivered only
between transactions, and the Controller's connection runs transactions.
"""

from __future__ import annotations

import inspect
import select
import time
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from typing import Any

import psycopg
from psycopg import sql

from .errors import NextminiError

TOPOLOGY_CHANNEL = "nextmini_topology"
METRICS_CHANNEL = "nextmini_metrics"
NODES_CHANNEL = "nextmini_nodes"
KNOWN_CHANNELS = (TOPOLOGY_CHANNEL, METRICS_CHANNEL, NODES_CHANNEL)
# The longest `Listener.wait` stays in the driver's wait before Python code
# runs again (and with it any signal handler that is due).
SIGNAL_SLICE = 0.5

Event = tuple[str, str]

# psycopg 3.2 added notifies(timeout=...); 3.1 gets a select()-based equivalent.
_NOTIFIES_HAS_TIMEOUT = "timeout" in inspect.signature(psycopg.Connection.notifies).parameters


def payload_topology(channel: str, payload: str) -> str | None:
    """The topology a notification is about, or None for channels we do not know."""
    if channel == TOPOLOGY_CHANNEL:
        return payload.split(" ", 1)[0]
    if channel == METRICS_CHANNEL:
        return payload
    if channel == NODES_CHANNEL:
        return payload.split(" ", 1)[0].rsplit("/", 1)[0]
    return None


def parse_node_event(payload: str) -> tuple[str, str, str]:
    """Splits a nextmini_nodes payload into (topology, node, state)."""
    where, _, state = payload.partition(" ")
    # The key may hold a "/" itself; node names never do.
    topology, _, node = where.rpartition("/")
    if not topology or not node or not state:
        raise ValueError(f"not a nextmini_nodes payload: {payload!r}")
    return topology, node, state


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def poll_notifies(conn: psycopg.Connection[Any], timeout: float | None) -> Generator[Event, None, None]:
    """Notifications of `conn` until `timeout` seconds pass (None: forever).

    The psycopg 3.1 path: wait on the socket with select() and read what libpq
    buffered. Used only when Connection.notifies() has no timeout.
    """
    deadline = _deadline(timeout)
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    while True:
        pgconn.consume_input()
        while True:
            note = pgconn.notifies()
            if note is None:
                break
            yield note.relname.decode(encoding), note.extra.decode(encoding)
        remaining = _remaining(deadline)
        if remaining == 0.0:
            return
        readable, _, _ = select.select([pgconn.socket], [], [], remaining)
        if not readable and _remaining(deadline) == 0.0:
            return


def _notifies(conn: psycopg.Connection[Any], timeout: float | None) -> Generator[Event, None, None]:
    if not _NOTIFIES_HAS_TIMEOUT:
        yield from poll_notifies(conn, timeout)
        return
    with closing(conn.notifies(timeout=timeout)) as notes:
        for note in notes:
            yield note.channel, note.payload


class Listener:
    """LISTENs on some channels from the moment it is created.

    Listening starts in the constructor, not at the first iteration, so a script
    can listen, then act, and still see the notifications its action causes.
    Iterate it for single events, or call `wait()` to get everything pending at
    once (what a control loop wants: one decision per burst, not per message).
    By default only events about `topology` are passed on.
    """

    def __init__(
        self,
        dsn: str,
        channels: str | Iterable[str] = (METRICS_CHANNEL,),
        *,
        topology: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.channels: tuple[str, ...] = (channels,) if isinstance(channels, str) else tuple(channels)
        if not self.channels:
            raise ValueError("listen to at least one channel")
        self.topology = topology
        self.timeout = timeout
        try:
            self._conn = psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError as e:
            raise NextminiError(f"cannot connect to the Nextmini database: {e}") from e
        try:
            for channel in self.channels:
                self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException:
            self._conn.close()
            raise

    def _wanted(self, channel: str, payload: str) -> bool:
        if self.topology is None:
            return True
        about = payload_topology(channel, payload)
        return about is None or about == self.topology

    def events(self, timeout: float | None = None) -> Generator[Event, None, None]:
        """(channel, payload) pairs until `timeout` seconds pass (None: forever).

        Do not call other methods of this listener while iterating: the
        connection is busy with this generator.
        """
        try:
            with closing(_notifies(self._conn, timeout)) as notes:
                for channel, payload in notes:
                    if self._wanted(channel, payload):
                        yield channel, payload
        except psycopg.OperationalError as e:
            raise NextminiError(f"lost the database connection while listening: {e}") from e

    def __iter__(self) -> Iterator[Event]:
        return self.events(self.timeout)

    def wait(self, timeout: float | None = None) -> list[Event]:
        """Waits up to `timeout` for an event, then returns it with all others pending.

        Returns [] when the time passed without one.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # Waits in slices: a signal that lands while the driver sits in its
            # C-level wait runs its Python handler (Ctrl-C, SIGTERM) only once
            # that wait returns, which without a timeout may be never.
            left = SIGNAL_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            got: list[Event] = []
            with closing(self.events(min(left, SIGNAL_SLICE))) as first:
                for event in first:
                    got.append(event)
                    break
            if got:
                got.extend(self.events(0))
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def close(self) -> None:
        """Stops listening (closing the connection ends every LISTEN)."""
        self._conn.close()

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
