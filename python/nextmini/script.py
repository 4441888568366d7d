"""What every control script needs around its algorithm: a CLI, logging, clean stops.

Kept in the package so each script is only its decision logic and its loop.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Callable, NoReturn

from .errors import NextminiError
from .model import check_port, protocol_number

log = logging.getLogger("nextmini")


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options all control scripts share."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dsn", help="PostgreSQL URL (default: $NEXTMINI_DATABASE_URL, else `nextmini db url`)")
    p.add_argument("--topology", "-t", help="topology to control (default: the only one)")
    p.add_argument("--once", action="store_true", help="decide once on the current state, act, and exit")
    p.add_argument("--verbose", "-v", action="store_true", help="log every decision, not only actions")
    return p


def protocol_arg(text: str) -> int:
    """argparse type for --protocol: a bad value is a usage error before anything connects."""
    try:
        number = protocol_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    assert number is not None
    return number


def port_arg(text: str) -> int:
    """argparse type for ports (1-65535)."""
    try:
        port = int(text)
        check_port(port, "port")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a port (1-65535): {text!r}") from e
    return port


def setup_logging(verbose: bool) -> None:
    """INFO by default: the actions a script takes are what its operator wants to see."""
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _terminate(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def run(main: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs a script's main loop; Ctrl-C or SIGTERM stop it cleanly (exit 0).

    Closing happens in the script's `with Controller(...)`; this only turns the
    signals into one exception and expected errors into a one-line message.
    """
    setup_logging(args.verbose)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return main(args)
    except KeyboardInterrupt:
        log.info("stopped")
        return 0
    except NextminiError as e:
        log.error("%s", e)
        return 1


def main_entry(
    build: Callable[[], argparse.ArgumentParser],
    main: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """Parses argv with `build()` and runs `main`; the body of a script's __main__."""
    return run(main, build().parse_args(argv if argv is not None else sys.argv[1:]))
