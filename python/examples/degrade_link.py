#!/usr/bin/env python3
"""Change a link's emulation parameters, now or in steps over time.

    degrade_link.py --link s-y --set loss_ppm=20000 --set delay_us=5000
    degrade_link.py --link s-y --set rate_bps=50000000 --then 10 --set rate_bps=5000000

Each --set KEY=VALUE is one parameter in the stored units (rate_bps, delay_us,
loss_ppm, queue as JSON, ...). --then SECONDS starts the next step after a pause,
so a script can replay a degradation. Values are parsed as JSON when they can be
(numbers, objects, null) and kept as text otherwise.

The database checks every step before it is written. A step it refuses is
reported with its message, which names the key and the rule (for example
``links s-y: params_forward.loss_ppm: must be at most 1000000, got 2000000``);
the steps before it stay applied and the script exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

try:
    import nextmini
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nextmini

from nextmini import Controller, script

log = logging.getLogger("degrade_link")


def parse_assignment(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE as JSON when it parses, else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def steps(argv_steps: list[list[Any]]) -> list[tuple[float, dict[str, Any]]]:
    """(pause before, parameters) for each step, from the --set/--then sequence."""
    out: list[tuple[float, dict[str, Any]]] = [(0.0, {})]
    for kind, value in argv_steps:
        if kind == "then":
            out.append((float(value), {}))
        else:
            key, v = value
            out[-1][1][key] = v
    return [(pause, params) for pause, params in out if params]


class Collect(argparse.Action):
    """Keeps --set and --then in the order they were given."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        seq = getattr(namespace, "sequence", None) or []
        seq.append(["then" if option_string == "--then" else "set", values])
        namespace.sequence = seq


def main(args: argparse.Namespace) -> int:
    plan = steps(getattr(args, "sequence", None) or [])
    if not plan:
        log.error("nothing to do: give at least one --set KEY=VALUE")
        return 2
    with Controller(args.dsn, args.topology) as ctl:
        for i, (pause, params) in enumerate(plan):
            time.sleep(pause)
            try:
                ctl.set_link(args.link, direction=args.direction, **params)
            except nextmini.LinkParamsError as e:
                log.error("step %d refused (%s %s): %s", i + 1, e.column, e.key or "-", e)
                return 2
            print(f"step {i + 1}: {args.link} {args.direction} {json.dumps(params)}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = script.parser(__doc__.strip().splitlines()[0])
    p.add_argument("--link", required=True, help="link name")
    p.add_argument("--direction", choices=("both", "forward", "backward"), default="both")
    p.add_argument("--set", type=parse_assignment, action=Collect, metavar="KEY=VALUE")
    p.add_argument("--then", type=float, action=Collect, metavar="SECONDS")
    return p


if __name__ == "__main__":
    sys.exit(script.main_entry(build_parser, main))
