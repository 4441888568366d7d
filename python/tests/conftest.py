"""Shared fixtures: the package on sys.path, a private PostgreSQL, a diamond topology.

`python3 -m pytest -q python/tests` from the repository root must work without
installing the package, so python/ goes on sys.path first.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PYTHON_DIR))

import psycopg  # noqa: E402

import pgserver  # noqa: E402

TOPOLOGY = "diamond"
# forward = dialer -> acceptor. d-c is dialed by d, so a-c-d crosses it backward.
LINKS = [
    ("a-b", "a", "b", {"rate_bps": 20_000_000, "delay_us": 1000, "loss_ppm": 0}),
    ("a-c", "a", "c", {"delay_us": 1000}),
    ("b-d", "b", "d", {"rate_bps": 20_000_000, "delay_us": 1000}),
    ("d-c", "d", "c", {"rate_bps": 20_000_000, "delay_us": 1000}),
]
NODES = ["a", "b", "c", "d"]


@pytest.fixture(scope="session")
def pg() -> Iterator[pgserver.PrivatePostgres]:
    """A private PostgreSQL for the whole session (skipped where it cannot run)."""
    reason = pgserver.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = pgserver.PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def dsn(pg: pgserver.PrivatePostgres) -> str:
    return pg.url


@contextmanager
def as_operator(conn: psycopg.Connection) -> Iterator[None]:
    """Writes as the operator: topologies, nodes and links are its rows to create
    and delete, and the database refuses that to anyone else. Afterwards the
    connection writes as a control script does again."""
    conn.execute("SET nextmini.writer = 'operator'")
    try:
        yield
    finally:
        conn.execute("RESET nextmini.writer")


def insert_topology(conn: psycopg.Connection, name: str = TOPOLOGY, namespace: str = "") -> int:
    """Inserts a diamond a-{b,c}-d the way the operator's store would."""
    with as_operator(conn):
        return _insert_topology(conn, name, namespace)


def _insert_topology(conn: psycopg.Connection, name: str, namespace: str = "") -> int:
    (topology_id,) = conn.execute(
        "INSERT INTO topologies"
        " (namespace, name, placement, runtime, overlay, underlay, processors, mapping, mtu, source)"
        " VALUES (%s, %s, 'netns', 'local', '198.18.0.0/16', '198.19.0.0/17', 2, 'sequential', 1400, '')"
        " RETURNING id",
        (namespace, name),
    ).fetchone()
    for idx, node in enumerate(NODES):
        conn.execute(
            "INSERT INTO nodes (topology_id, name, idx, overlay_addr, underlay_addr, credential_sha256)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (topology_id, node, idx, f"198.18.0.{idx + 1}", f"198.19.0.{idx + 1}", "0" * 64),
        )
    for link, dialer, acceptor, params in LINKS:
        conn.execute(
            "INSERT INTO links"
            " (topology_id, name, dialer, acceptor, transport, params_forward, params_backward)"
            " VALUES (%s, %s, %s, %s, 'tcp', %s, %s)",
            (
                topology_id,
                link,
                dialer,
                acceptor,
                psycopg.types.json.Jsonb(params),
                psycopg.types.json.Jsonb(params),
            ),
        )
    return topology_id


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to a database holding only the diamond topology."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with as_operator(conn):
            conn.execute("DELETE FROM topologies")
        insert_topology(conn)
        yield conn


def insert_sample(
    conn: psycopg.Connection,
    link: str,
    node: str,
    *,
    tx_bytes: int = 0,
    rx_bytes: int = 0,
    connected: bool = True,
    drops: int = 0,
    queue_packets: int = 0,
    at: datetime | None = None,
    topology: str = TOPOLOGY,
) -> None:
    """One link_metrics row, as the hub writes a report (at defaults to now)."""
    conn.execute(
        "INSERT INTO link_metrics (topology_id, link, node, at, connected, tx_bytes, tx_packets,"
        " rx_bytes, rx_packets, drops, ecn_marks, queue_packets, queue_bytes)"
        " SELECT id, %s, %s, %s, %s, %s, 0, %s, 0, %s, 0, %s, 0 FROM topologies WHERE name = %s",
        (
            link,
            node,
            at or datetime.now(timezone.utc),
            connected,
            tx_bytes,
            rx_bytes,
            drops,
            queue_packets,
            topology,
        ),
    )


def insert_rate(
    conn: psycopg.Connection,
    link: str,
    node: str,
    tx_bps: float,
    *,
    rx_bps: float = 0.0,
    seconds_ago: float = 2.0,
) -> None:
    """Two samples one second apart, so link_rates shows `tx_bps` for this reporter."""
    now = datetime.now(timezone.utc)
    first = now - timedelta(seconds=seconds_ago)
    insert_sample(conn, link, node, at=first)
    insert_sample(
        conn,
        link,
        node,
        at=first + timedelta(seconds=1),
        tx_bytes=int(tx_bps / 8),
        rx_bytes=int(rx_bps / 8),
    )


EXAMPLES = PYTHON_DIR / "examples"


def load_example(name: str):
    """Imports an example script as a module, for its pure decision functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _example_command(name: str, dsn: str, args: tuple) -> tuple:
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), "NEXTMINI_DATABASE_URL": dsn}
    return [sys.executable, str(EXAMPLES / f"{name}.py"), *args], env


def run_example(name: str, dsn: str, *args: str) -> subprocess.CompletedProcess:
    """Runs an example script as a user would, against `dsn`, with this checkout's package."""
    command, env = _example_command(name, dsn, args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def start_example(name: str, dsn: str, *args: str) -> subprocess.Popen:
    """Starts an example script in the background (line-buffered text pipes)."""
    command, env = _example_command(name, dsn, args)
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        # A suite started in the background by a non-interactive shell inherits
        # SIGINT ignored, and Python then installs no Ctrl-C handler: the tests
        # that stop a script with SIGINT need it as a terminal would give it.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_line(stream, timeout: float = 10.0) -> str:
    """The next line of a child's pipe, or "" after `timeout` seconds (never hangs a test)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""
