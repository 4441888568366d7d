"""Finding the database: the same place the `nextmini` CLI uses.

A script started next to `nextmini up` should need no configuration, so without
an explicit DSN we ask the CLI itself (`nextmini db url`), which knows the state
directory and port of the private PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from .errors import NextminiError

DSN_ENV = "NEXTMINI_DATABASE_URL"
BIN_ENV = "NEXTMINI_BIN"


def find_cli(environ: Mapping[str, str] = os.environ) -> str | None:
    """The nextmini binary: $NEXTMINI_BIN if set, else `nextmini` on PATH."""
    explicit = environ.get(BIN_ENV)
    if explicit:
        return explicit
    return shutil.which("nextmini", path=environ.get("PATH"))


def resolve_dsn(dsn: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """The connection string to use: `dsn`, else $NEXTMINI_DATABASE_URL, else `nextmini db url`."""
    if dsn:
        return dsn
    from_env = environ.get(DSN_ENV)
    if from_env:
        return from_env
    cli = find_cli(environ)
    if cli is None:
        raise NextminiError(
            f"no database given: pass dsn=, set {DSN_ENV}, or put the nextmini binary on PATH "
            f"(or name it in {BIN_ENV}) so `nextmini db url` can tell"
        )
    try:
        out = subprocess.run(
            [cli, "db", "url"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(environ),
        )
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        raise NextminiError(f"`{cli} db url` failed: {detail.strip()}") from e
    url = out.stdout.strip().splitlines()[-1].strip() if out.stdout.strip() else ""
    if not url:
        raise NextminiError(f"`{cli} db url` printed no URL")
    return url
