#!/usr/bin/env python3
"""Keep one traffic aggregate on the least-loaded path between two nodes.

On every metrics notification: list the candidate paths from src to dst, give
each the load of its busiest hop (sent rate over configured rate, in the
direction of travel), and move the aggregate when another path beats the
current one by more than the hysteresis margin.

A path's load is predicted *with our own traffic on it*: the aggregate's rate is
estimated as its fair share of the smallest sent rate along its current path
(every hop there carries it, shared with the other steered aggregates whose
routes cross the path) and added to the hops a candidate does not share with
that path. Without this, a single flow flips between two idle paths forever,
since the path it is on always looks busiest.

    least_loaded.py --src a --dst d --dst-port 5201 --protocol tcp
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    import nextmini
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nextmini

from nextmini import Controller, Direction, Link, Match, script
from nextmini.model import Route
from nextmini.events import METRICS_CHANNEL
from nextmini.graph import hops, path_name, shortest_path, simple_paths

log = logging.getLogger("least_loaded")

NodePath = tuple[str, ...]


# -- decision (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class PathLoad:
    """A path's load: the utilisation of its busiest hop, and which link that is."""

    path: NodePath
    load: float
    bottleneck: str | None


@dataclass(frozen=True)
class Decision:
    """What to do, with the numbers that led there (for the log)."""

    move: bool
    current: PathLoad
    best: PathLoad
    loads: tuple[PathLoad, ...]

    def describe(self, match: Match) -> str:
        def show(p: PathLoad) -> str:
            return f"{path_name(p.path)} ({p.load:.0%})"

        if self.move:
            return f"{match}: moved from {show(self.current)} to {show(self.best)}"
        return f"{match}: stays on {show(self.current)}, best is {show(self.best)}"


def hop_utilisation(link: Link, direction: Direction, extra_bps: float, unshaped_high_bps: float) -> float:
    """Load of one direction of a link if `extra_bps` more were sent on it.

    Shaped: sent rate over configured rate. Unshaped links have no capacity to
    compare with, so they count as idle unless their rate reaches
    `unshaped_high_bps`, from where they count as at least fully loaded.
    """
    sent = max(0.0, (link.traffic(direction).tx_bps or 0.0) + extra_bps)
    rate = link.rate_bps(direction)
    if rate is None:
        return 0.0 if sent < unshaped_high_bps else sent / unshaped_high_bps
    return sent / rate


def own_rate(path: Sequence[str], links: Mapping[str, Link], sharing: int = 1) -> float:
    """Estimated rate of our aggregate, 0 if unmeasured: the least sent along its
    path, split fairly among the `sharing` steered aggregates on it (ours included).

    Every hop of the path carries the aggregate, so no hop sends less than it;
    unsteered cross traffic only makes this an overestimate, which makes moves rarer.
    """
    rates = [links[hop.link].traffic(hop.direction).tx_bps for hop in hops(path, links.values())]
    known = [r for r in rates if r is not None and r >= 0]
    least = min(known) if len(known) == len(rates) and known else 0.0
    return least / max(sharing, 1)


def path_load(
    path: Sequence[str],
    links: Mapping[str, Link],
    *,
    current: Sequence[str] = (),
    own_bps: float = 0.0,
    unshaped_high_bps: float = 1e9,
) -> PathLoad:
    """Load of `path` with our aggregate moved onto it.

    Hops also on the `current` path already carry the aggregate; the others
    would get `own_bps` more.
    """
    on_current = set(hops(current, links.values())) if len(current) > 1 else set()
    worst, bottleneck = 0.0, None
    for hop in hops(path, links.values()):
        extra = 0.0 if hop in on_current else own_bps
        load = hop_utilisation(links[hop.link], hop.direction, extra, unshaped_high_bps)
        if bottleneck is None or load > worst:
            worst, bottleneck = load, hop.link
    return PathLoad(tuple(path), worst, bottleneck)


def decide(
    candidates: Sequence[Sequence[str]],
    current: Sequence[str],
    links: Mapping[str, Link],
    *,
    hysteresis: float = 0.10,
    unshaped_high_bps: float = 1e9,
    self_correct: bool = True,
    sharing: int = 1,
) -> Decision:
    """Picks the least-loaded candidate; moves only if it beats `current` by > hysteresis.

    Ties go to the earlier candidate (fewer hops first, as paths() orders them).
    """
    own = own_rate(current, links, sharing) if self_correct else 0.0
    here = path_load(current, links, current=current, unshaped_high_bps=unshaped_high_bps)
    loads = tuple(
        here
        if tuple(p) == tuple(current)
        else path_load(p, links, current=current, own_bps=own, unshaped_high_bps=unshaped_high_bps)
        for p in candidates
    )
    best = min(loads, key=lambda p: p.load, default=here)
    move = best.path != here.path and here.load - best.load > hysteresis
    return Decision(move, here, best, loads)


# -- I/O ---------------------------------------------------------------------


def current_path(ctl: Controller, match: Match, links: Sequence[Link]) -> NodePath | None:
    """The path the aggregate takes now: its rule's route, else the default shortest path.

    A multipath group is reported by its heaviest path; moving replaces it whole.
    """
    group = ctl.paths_for(
        match.src, match.dst, protocol=match.protocol, src_port=match.src_port, dst_port=match.dst_port
    )
    if group:
        return max(group, key=lambda pw: pw[1])[0]
    path = shortest_path(links, match.src, match.dst)
    return tuple(path) if path else None


def steered_on(routes: Sequence[Route], path: Sequence[str], ours: Match) -> int:
    """How many steered aggregates share a hop with `path`, ours counted once."""
    on_path = set(zip(path, path[1:]))
    on_path |= {(b, a) for a, b in on_path}
    matches = {ours}
    for route in routes:
        if on_path & set(zip(route.path, route.path[1:])):
            matches.update(rule.match for rule in route.rules)
    return len(matches)


def step(ctl: Controller, match: Match, args: argparse.Namespace) -> Decision | None:
    """One round: read links and the current path, decide, and move if told to."""
    links = ctl.links()
    down = [link.name for link in links if link.connected is False]
    candidates = simple_paths(links, match.src, match.dst, avoid_links=down, max_paths=args.max_paths)
    current = current_path(ctl, match, links)
    if not candidates or current is None:
        log.warning("%s: no path between %s and %s", match, match.src, match.dst)
        return None
    decision = decide(
        candidates,
        current,
        {link.name: link for link in links},
        hysteresis=args.hysteresis / 100.0,
        unshaped_high_bps=args.unshaped_high_bps,
        sharing=steered_on(ctl.routes(), current, match),
    )
    if decision.move:
        ctl.set_route(
            match.src,
            match.dst,
            list(decision.best.path),
            protocol=match.protocol,
            src_port=match.src_port,
            dst_port=match.dst_port,
        )
        print(decision.describe(match), flush=True)
    else:
        log.debug("%s", decision.describe(match))
    return decision


def main(args: argparse.Namespace) -> int:
    try:
        match = Match.of(
            args.src, args.dst, protocol=args.protocol, src_port=args.src_port, dst_port=args.dst_port
        )
    except ValueError as e:  # e.g. src == dst
        log.error("%s", e)
        return 2
    # Listen before the first look, so metrics stored while we decide are not missed.
    with Controller(args.dsn, args.topology) as ctl, ctl.listen(METRICS_CHANNEL) as metrics:
        log.info("steering %s in topology %s", match, ctl.topology)
        moved_at = float("-inf")
        while True:
            # After a move, let the metrics show its effect before judging again.
            if time.monotonic() - moved_at >= args.hold_down:
                try:
                    decision = step(ctl, match, args)
                except nextmini.RouteError as e:
                    log.error("%s: route refused: %s", match, e)
                    decision = None
                if decision is not None and decision.move:
                    moved_at = time.monotonic()
            if args.once:
                return 0
            metrics.wait(timeout=None)


def build_parser() -> argparse.ArgumentParser:
    p = script.parser(__doc__.strip().splitlines()[0])
    p.add_argument("--src", required=True, help="source node")
    p.add_argument("--dst", required=True, help="destination node")
    p.add_argument("--protocol", type=script.protocol_arg, help="tcp, udp, icmp or a number (default: any)")
    p.add_argument("--src-port", type=script.port_arg, help="source port (default: any)")
    p.add_argument("--dst-port", type=script.port_arg, help="destination port (default: any)")
    p.add_argument(
        "--hysteresis", type=float, default=10.0, help="percentage points a path must win by (default 10)"
    )
    p.add_argument("--max-paths", type=int, default=8, help="candidate paths to consider (default 8)")
    p.add_argument(
        "--unshaped-high-bps",
        type=float,
        default=1e9,
        help="rate at which an unshaped link counts as loaded (default 1e9)",
    )
    p.add_argument("--hold-down", type=float, default=3.0, help="seconds to wait after a move (default 3)")
    return p


if __name__ == "__main__":
    sys.exit(script.main_entry(build_parser, main))
