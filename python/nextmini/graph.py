"""Paths through a topology, computed from its links alone.

Pure functions over anything with ``name``, ``dialer`` and ``acceptor`` (a
`nextmini.Link`, or a small tuple in tests), so algorithms can be tested without a
database. Routes are node paths, so the graph is undirected: a link carries
traffic both ways. Neighbours are visited in link-name order, the tie-break the
planner uses for default routes, which keeps every result deterministic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from typing import (
    NamedTuple,
    Protocol,
)

from .model import Direction


class LinkEnds(Protocol):
    """What the graph functions need of a link."""

    @property
    def name(self) -> str: ...
    @property
    def dialer(self) -> str: ...
    @property
    def acceptor(self) -> str: ...


class Edge(NamedTuple):
    """A minimal link, for building graphs by hand (tests, what-if questions)."""

    name: str
    dialer: str
    acceptor: str


class Hop(NamedTuple):
    """One step of a path: the link it crosses and in which direction."""

    link: str
    direction: Direction


Adjacency = dict[str, list[tuple[str, str]]]


def adjacency(
    links: Iterable[LinkEnds],
    *,
    avoid_links: Collection[str] = (),
    avoid_nodes: Collection[str] = (),
) -> Adjacency:
    """Maps each node to its (link name, neighbour) pairs, in link-name order.

    Avoided links and every link touching an avoided node are left out, which is
    how callers ask for "a path that does not use X".
    """
    avoid_links = set(avoid_links)
    avoid_nodes = set(avoid_nodes)
    graph: Adjacency = {}
    for link in sorted(links, key=lambda link: link.name):
        graph.setdefault(link.dialer, [])
        graph.setdefault(link.acceptor, [])
        if link.name in avoid_links or link.dialer in avoid_nodes or link.acceptor in avoid_nodes:
            continue
        graph[link.dialer].append((link.name, link.acceptor))
        graph[link.acceptor].append((link.name, link.dialer))
    return graph


def _neighbours(graph: Adjacency, node: str) -> list[str]:
    """Distinct neighbours in link-name order (parallel links collapse: routes name nodes)."""
    seen: dict[str, None] = {}
    for _, neighbour in graph.get(node, []):
        seen.setdefault(neighbour, None)
    return list(seen)


def _check_ends(src: str, dst: str) -> None:
    if src == dst:
        raise ValueError(f"src and dst are the same node {src!r}")


def shortest_path(
    links: Iterable[LinkEnds],
    src: str,
    dst: str,
    *,
    avoid_links: Collection[str] = (),
    avoid_nodes: Collection[str] = (),
) -> list[str] | None:
    """The path with fewest hops from src to dst, or None when none is left.

    Breadth-first, so among equally short paths the one whose links come first by
    name wins, as in the planner's default routes.
    """
    _check_ends(src, dst)
    graph = adjacency(links, avoid_links=avoid_links, avoid_nodes=avoid_nodes)
    if src not in graph or dst not in graph or src in avoid_nodes or dst in avoid_nodes:
        return None
    parent: dict[str, str | None] = {src: None}
    queue: deque[str] = deque([src])
    while queue:
        node = queue.popleft()
        if node == dst:
            path = [dst]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])  # type: ignore[arg-type]
            return path[::-1]
        for neighbour in _neighbours(graph, node):
            if neighbour not in parent:
                parent[neighbour] = node
                queue.append(neighbour)
    return None


def simple_paths(
    links: Iterable[LinkEnds],
    src: str,
    dst: str,
    *,
    avoid_links: Collection[str] = (),
    avoid_nodes: Collection[str] = (),
    max_paths: int = 8,
) -> list[list[str]]:
    """Up to `max_paths` loop-free paths from src to dst, fewest hops first.

    Breadth-first over partial paths, so the result is in hop order and the search
    stops as soon as enough paths are found. Reachability is checked first: without
    it, an unreachable dst would make the search enumerate every simple path.
    """
    if max_paths < 1:
        raise ValueError("max_paths must be at least 1")
    links = list(links)
    if shortest_path(links, src, dst, avoid_links=avoid_links, avoid_nodes=avoid_nodes) is None:
        return []
    graph = adjacency(links, avoid_links=avoid_links, avoid_nodes=avoid_nodes)
    found: list[list[str]] = []
    queue: deque[list[str]] = deque([[src]])
    while queue and len(found) < max_paths:
        path = queue.popleft()
        for neighbour in _neighbours(graph, path[-1]):
            if neighbour in path:
                continue
            if neighbour == dst:
                found.append(path + [dst])
                if len(found) == max_paths:
                    break
            else:
                queue.append(path + [neighbour])
    return found


def hops(path: Sequence[str], links: Iterable[LinkEnds]) -> list[Hop]:
    """The links a path crosses, each with the direction of travel.

    Direction matters because each direction has its own rate and load. Between
    two nodes joined by parallel links, the lowest-named link is reported.
    """
    by_ends: dict[tuple[str, str], Hop] = {}
    for link in sorted(links, key=lambda link: link.name, reverse=True):
        by_ends[(link.dialer, link.acceptor)] = Hop(link.name, "forward")
        by_ends[(link.acceptor, link.dialer)] = Hop(link.name, "backward")
    result = []
    for a, b in zip(path, path[1:]):
        hop = by_ends.get((a, b))
        if hop is None:
            raise ValueError(f"no link between {a} and {b}")
        result.append(hop)
    return result


def path_name(path: Sequence[str]) -> str:
    """The conventional route name for a path: its nodes joined by '-' ("a-b-d")."""
    return "-".join(path)


def uses_link(path: Sequence[str], link: LinkEnds) -> bool:
    """Whether consecutive nodes of `path` are the two ends of `link`."""
    ends = {link.dialer, link.acceptor}
    return any({a, b} == ends for a, b in zip(path, path[1:]))
