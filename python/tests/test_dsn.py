"""Where the DSN comes from: argument, then $NEXTMINI_DATABASE_URL, then `nextmini db url`."""

from __future__ import annotations

import pytest

from nextmini import NextminiError
from nextmini.dsn import resolve_dsn


def fake_cli(tmp_path, body: str) -> str:
    cli = tmp_path / "nextmini"
    cli.write_text("#!/bin/sh\n" + body + "\n")
    cli.chmod(0o755)
    return str(cli)


def test_explicit_then_environment_then_cli(tmp_path):
    cli = fake_cli(tmp_path, 'test "$1 $2" = "db url" && echo postgres://from-cli/nextmini')
    env = {"NEXTMINI_DATABASE_URL": "postgres://from-env/db", "NEXTMINI_BIN": cli}
    assert resolve_dsn("postgres://given/db", env) == "postgres://given/db"
    assert resolve_dsn(None, env) == "postgres://from-env/db"
    assert resolve_dsn(None, {"NEXTMINI_BIN": cli}) == "postgres://from-cli/nextmini"
    assert resolve_dsn(None, {"PATH": str(tmp_path)}) == "postgres://from-cli/nextmini"


def test_errors_say_what_to_set(tmp_path):
    with pytest.raises(NextminiError, match="NEXTMINI_DATABASE_URL"):
        resolve_dsn(None, {"PATH": str(tmp_path)})
    broken = fake_cli(tmp_path, "echo 'no state directory' >&2; exit 3")
    with pytest.raises(NextminiError, match="no state directory"):
        resolve_dsn(None, {"NEXTMINI_BIN": broken})
    with pytest.raises(NextminiError, match="printed no URL"):
        resolve_dsn(None, {"NEXTMINI_BIN": fake_cli(tmp_path, "true")})
