"""A private PostgreSQL for the tests, started with the project's own CLI.

The tests exercise the real schema (its triggers are half of the behaviour), so
they run `nextmini db start` in a throw-away state directory, exactly as local
mode does, and stop and delete it afterwards.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = REPO / "operator" / "migrations"


def find_binary() -> Path | None:
    """The nextmini CLI as built, release first (never built here: others own it)."""
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "nextmini"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def unavailable_reason() -> str | None:
    """Why a private PostgreSQL cannot be started here, or None when it can."""
    if find_binary() is None:
        return f"no nextmini binary in {REPO}/target/release or target/debug (build it with cargo first)"
    if os.geteuid() != 0:
        return "`nextmini db start` needs root (it runs PostgreSQL as the postgres user)"
    return None


def free_port(start: int = 58000) -> int:
    """A port number nothing listens on. The server uses only a Unix socket, but the
    port names that socket and PostgreSQL's shared memory, so keep clear of others."""
    for port in range(start + os.getpid() % 1000, start + 2000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port above 58000")


class PrivatePostgres:
    """One `nextmini db start` server in its own state directory."""

    def __init__(self) -> None:
        binary = find_binary()
        assert binary is not None
        self.binary = binary
        # /tmp rather than pytest's tmp_path: the postgres user must traverse it.
        self.state_dir = Path(tempfile.mkdtemp(prefix="nextmini-pytest-"))
        self.state_dir.chmod(0o755)
        self.env: dict[str, str] = {
            **os.environ,
            "NEXTMINI_STATE_DIR": str(self.state_dir),
            "NEXTMINI_PG_PORT": str(free_port()),
        }
        self.env.pop("NEXTMINI_DATABASE_URL", None)
        self.url = ""

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, text=True, timeout=180
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"nextmini {' '.join(args)} failed ({out.returncode}):\n{out.stderr}{out.stdout}"
            )
        return out.stdout

    def start(self) -> None:
        self.cli("db", "start")
        self.url = self.cli("db", "url").strip()
        apply_pending_migrations(self.url)

    def stop(self) -> None:
        try:
            self.cli("db", "stop")
        finally:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def apply_pending_migrations(url: str) -> list[int]:
    """Applies migrations from the checkout that the binary did not know yet.

    The binary embeds the migrations it was built with; when the checkout has newer
    ones (0004 while the Rust side is being rebuilt), they are applied the way sqlx
    would and recorded with sqlx's checksum (SHA-384 of the file), so a later run of
    a rebuilt binary sees them as applied. Returns the versions applied here.
    """
    applied_now: list[int] = []
    with psycopg.connect(url, autocommit=True) as conn:
        done = {row[0] for row in conn.execute("SELECT version FROM _sqlx_migrations WHERE success")}
        for path in sorted(MIGRATIONS.glob("*.sql")):
            found = re.match(r"^(\d+)_(.*)\.sql$", path.name)
            if not found or int(found.group(1)) in done:
                continue
            version, description = int(found.group(1)), found.group(2).replace("_", " ")
            text = path.read_bytes()
            started = time.monotonic_ns()
            with conn.transaction():
                conn.execute(text.decode())
                conn.execute(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)"
                    " VALUES (%s, %s, true, %s, %s)",
                    (version, description, hashlib.sha384(text).digest(), time.monotonic_ns() - started),
                )
            applied_now.append(version)
    return applied_now
