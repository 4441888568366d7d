#!/usr/bin/env python3
"""Move explicit routes off failed links and nodes.

Watches nextmini_metrics and nextmini_nodes. A link is failed when either end's
latest report says it is disconnected; a node is failed when its agent's stream
is 'disconnected'. Every rule whose route crosses a failure is moved to the
shortest path that avoids all current failures, or removed (back to the default
shortest path) when no such path is left. A multipath group keeps its other
paths; weights of paths that end up the same are added.

Nothing is moved back unless --restore: then a group this script moved returns
to its original paths once they all work again, provided nobody changed the
group in the meantime. What was moved is remembered in memory only.

The decision is made from the whole current state on every event, not from the
event itself, so a missed or repeated notification does no harm.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    import nextmini
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nextmini

from nextmini import Controller, Link, Match, Node, Route, script
from nextmini.events import METRICS_CHANNEL, NODES_CHANNEL
from nextmini.graph import path_name, shortest_path

log = logging.getLogger("reroute_on_failure")

NodePath = tuple[str, ...]
#: the (path, weight) pairs of one match, in rule order
Group = tuple[tuple[NodePath, int], ...]


# -- decision (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class Failures:
    """What is broken right now."""

    links: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.links or self.nodes)


@dataclass(frozen=True)
class Action:
    """Replace the rules of `match`: `old` → `new` (empty `new`: remove them)."""

    match: Match
    old: Group
    new: Group

    def describe(self) -> str:
        def show(group: Group) -> str:
            if not group:
                return "the default shortest path"
            return ", ".join(path_name(p) + (f" x{w}" if len(group) > 1 else "") for p, w in group)

        return f"{self.match}: {show(self.old)} -> {show(self.new)}"


@dataclass
class Memory:
    """Groups this script moved: match → (original group, group we set). For --restore."""

    moved: dict[Match, tuple[Group, Group]] = field(default_factory=dict)


def find_failures(links: Iterable[Link], nodes: Iterable[Node]) -> Failures:
    """Failed links (a disconnected report) and nodes (a disconnected agent)."""
    return Failures(
        links=frozenset(link.name for link in links if link.connected is False),
        nodes=frozenset(node.name for node in nodes if node.agent_state == "disconnected"),
    )


def rule_groups(routes: Iterable[Route]) -> dict[Match, Group]:
    """The routes' rules regrouped by match, each with its (path, weight) pairs in rule order."""
    rules = sorted(
        ((rule.id, rule.match, route.path, rule.weight) for route in routes for rule in route.rules),
        key=lambda r: r[0],
    )
    groups: dict[Match, list[tuple[NodePath, int]]] = {}
    for _, match, path, weight in rules:
        groups.setdefault(match, []).append((tuple(path), weight))
    return {match: tuple(group) for match, group in groups.items()}


def path_works(path: Sequence[str], links: Sequence[Link], failures: Failures) -> bool:
    """Whether every node of `path` is up and every hop has a link that is not failed."""
    if any(node in failures.nodes for node in path):
        return False
    up = {frozenset((link.dialer, link.acceptor)) for link in links if link.name not in failures.links}
    return all(frozenset((a, b)) in up for a, b in zip(path, path[1:]))


def _merge(pairs: Iterable[tuple[NodePath, int]]) -> Group:
    merged: OrderedDict[NodePath, int] = OrderedDict()
    for path, weight in pairs:
        merged[path] = merged.get(path, 0) + weight
    return tuple(merged.items())


def same_group(a: Group, b: Group) -> bool:
    """Groups are equal whatever the order of their rules."""
    return sorted(a) == sorted(b)


def plan_reroutes(groups: Mapping[Match, Group], links: Sequence[Link], failures: Failures) -> list[Action]:
    """For each group crossing a failure, the group with those paths replaced.

    A broken path is replaced by the shortest path avoiding every current failure
    (its weight goes with it), or dropped when there is none.
    """
    actions = []
    for match, group in groups.items():
        if all(path_works(path, links, failures) for path, _ in group):
            continue
        detour = shortest_path(
            links, match.src, match.dst, avoid_links=failures.links, avoid_nodes=failures.nodes
        )
        new = []
        for path, weight in group:
            if path_works(path, links, failures):
                new.append((path, weight))
            elif detour is not None:
                new.append((tuple(detour), weight))
        actions.append(Action(match, group, _merge(new)))
    return actions


def plan_restores(
    memory: Memory, groups: Mapping[Match, Group], links: Sequence[Link], failures: Failures
) -> tuple[list[Action], list[Match]]:
    """Groups to move back to their original paths, and matches to forget.

    A match is forgotten when someone else changed its group after we did (their
    choice wins); it is restored when every original path works again.
    """
    restores, forget = [], []
    for match, (original, ours) in memory.moved.items():
        current = groups.get(match, ())
        if not same_group(current, ours):
            forget.append(match)
        elif all(path_works(path, links, failures) for path, _ in original):
            restores.append(Action(match, current, original))
    return restores, forget


def remember(memory: Memory, action: Action) -> None:
    """Notes a move; after several moves the first group is still the original."""
    original = memory.moved[action.match][0] if action.match in memory.moved else action.old
    memory.moved[action.match] = (original, action.new)


# -- I/O ---------------------------------------------------------------------


def apply(ctl: Controller, action: Action) -> None:
    """Writes one action as one transaction."""
    m = action.match
    if action.new:
        paths = [(list(p), w) for p, w in action.new]
        ctl.set_multipath(m.src, m.dst, paths, protocol=m.protocol, src_port=m.src_port, dst_port=m.dst_port)
    else:
        ctl.clear_routes(m.src, m.dst, protocol=m.protocol, src_port=m.src_port, dst_port=m.dst_port)
    print(action.describe(), flush=True)


def step(ctl: Controller, memory: Memory, restore: bool) -> list[Action]:
    """One round on the current state: move what is broken, restore what healed."""
    links, nodes = ctl.links(), ctl.nodes()
    failures = find_failures(links, nodes)
    groups = rule_groups(ctl.routes())
    done: list[Action] = []
    if failures:
        log.debug("failed links %s, nodes %s", sorted(failures.links), sorted(failures.nodes))
    for action in plan_reroutes(groups, links, failures):
        try:
            apply(ctl, action)
        except nextmini.RouteError as e:  # the topology changed under us; next event retries
            log.error("%s: %s", action.match, e)
            continue
        done.append(action)
        if restore:
            remember(memory, action)
    if restore:
        groups = rule_groups(ctl.routes()) if done else groups
        restores, forget = plan_restores(memory, groups, links, failures)
        for match in forget:
            log.info("%s was changed by someone else; not restoring it", match)
            memory.moved.pop(match, None)
        for action in restores:
            try:
                apply(ctl, action)
            except nextmini.RouteError as e:
                log.error("%s: %s", action.match, e)
                continue
            memory.moved.pop(action.match, None)
            done.append(action)
    return done


def main(args: argparse.Namespace) -> int:
    memory = Memory()
    # Listen before the first look, so a failure reported meanwhile is not missed.
    with Controller(args.dsn, args.topology) as ctl, ctl.listen((METRICS_CHANNEL, NODES_CHANNEL)) as events:
        restoring = " (restoring)" if args.restore else ""
        log.info("watching topology %s for failures%s", ctl.topology, restoring)
        step(ctl, memory, args.restore)  # failures from before we started
        if args.once:
            return 0
        while True:
            if events.wait(timeout=None):
                step(ctl, memory, args.restore)


def build_parser() -> argparse.ArgumentParser:
    p = script.parser(__doc__.strip().splitlines()[0])
    p.add_argument(
        "--restore", action="store_true", help="move groups back when their original paths work again"
    )
    return p


if __name__ == "__main__":
    sys.exit(script.main_entry(build_parser, main))
