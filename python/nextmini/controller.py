"""The Controller: one topology's state in PostgreSQL, read and changed by rows.

Nextmini's control plane keeps the desired state in PostgreSQL and its operator
turns every committed change into control messages for the node agents. So a
control algorithm needs no RPC: it reads rows, decides, and writes rows in one
transaction. The schema's triggers validate routes, bump the topology's
generation and NOTIFY the operator; this class only has to bind values and map
the database's messages to Python exceptions.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Union

import psycopg
from psycopg.types.json import Jsonb

from . import graph
from .dsn import resolve_dsn
from .errors import LinkParamsError, NextminiError, NotFoundError, RefusedWriteError, RouteError
from .events import METRICS_CHANNEL, Event, Listener
from .model import (
    Direction,
    Link,
    LinkRate,
    Match,
    Node,
    Route,
    Rule,
    Traffic,
    check_direction,
)

ProtocolArg = Union[str, int, None]
PathWeights = Iterable[tuple[Sequence[str], int]]

# Every statement below is a constant; values travel only as bound parameters.

_MATCH_WHERE = """
    topology_id = %(t)s AND src = %(src)s AND dst = %(dst)s
    AND protocol IS NOT DISTINCT FROM %(protocol)s::integer
    AND src_port IS NOT DISTINCT FROM %(src_port)s::integer
    AND dst_port IS NOT DISTINCT FROM %(dst_port)s::integer
"""

_LATEST_SAMPLES = """
    SELECT DISTINCT ON (r.link, r.node)
           r.link, r.node, r.at, r.tx_bps::float8, r.rx_bps::float8, r.new_drops,
           r.queue_packets, r.connected, m.drops
    FROM link_rates r
    JOIN link_metrics m ON m.topology_id = r.topology_id AND m.link = r.link
                       AND m.node = r.node AND m.at = r.at
    WHERE r.topology_id = %(t)s
"""

_RATES_COLUMNS = """
    SELECT link, node, at, tx_bps::float8, rx_bps::float8, new_drops, queue_packets, rtt_us, connected
    FROM link_rates
    WHERE topology_id = %(t)s AND at >= now() - %(since)s::interval
"""


def _clean_rate(value: float | None) -> float | None:
    """A rate from the view, or None when it is unusable.

    A negative rate means the reporter's counters restarted (its agent restarted),
    so that one sample tells nothing about load.
    """
    if value is None or value < 0:
        return None
    return value


def assemble_link(row: Sequence[Any], samples: dict[str, Sequence[Any]]) -> Link:
    """Builds a Link from its row and the latest sample of each end, keyed by node.

    The sender of a direction reports tx, queue and drops; the receiver reports rx.
    """
    name, dialer, acceptor, transport, forward, backward = row
    ends = {node: samples.get(node) for node in (dialer, acceptor)}

    def traffic(sender: str, receiver: str) -> Traffic:
        s, r = ends[sender], ends[receiver]
        return Traffic(
            tx_bps=_clean_rate(s[3]) if s else None,
            rx_bps=_clean_rate(r[4]) if r else None,
            queue_packets=s[6] if s else None,
            drops=s[8] if s else None,
            new_drops=s[5] if s else None,
            at=s[2] if s else None,
        )

    reported = [sample[7] for sample in ends.values() if sample is not None]
    return Link(
        name=name,
        dialer=dialer,
        acceptor=acceptor,
        transport=transport,
        params_forward=forward,
        params_backward=backward,
        connected=all(reported) if reported else None,
        forward=traffic(dialer, acceptor),
        backward=traffic(acceptor, dialer),
    )


class Controller:
    """Reads and changes one topology of a Nextmini database.

    Every method runs in its own short transaction (autocommit is off, so a write
    of several statements is all-or-nothing, and no transaction stays open between
    calls). Listening happens on separate autocommit connections. Example::

        with Controller() as ctl:
            ctl.set_route("a", "d", ["a", "c", "d"], protocol="tcp", dst_port=5201)
    """

    def __init__(self, dsn: str | None = None, topology: str | None = None) -> None:
        self.dsn = resolve_dsn(dsn)
        try:
            self._conn = psycopg.connect(self.dsn, autocommit=False)
        except psycopg.OperationalError as e:
            raise NextminiError(f"cannot connect to the Nextmini database: {e}") from e
        self._metrics_listener: Listener | None = None
        try:
            self._topology_id, self.topology = self._find_topology(topology)
        except BaseException:
            self._conn.close()
            raise

    # -- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Closes the connection and any listener wait_for_metrics started."""
        if self._metrics_listener is not None:
            self._metrics_listener.close()
            self._metrics_listener = None
        self._conn.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection]:
        """One transaction; a validation trigger's RAISE becomes a RouteError.

        The trigger's text is kept as it is, because it already names the route,
        the nodes and the path positions at fault. A lost connection becomes a
        NextminiError, so a script can report it in one line.
        """
        try:
            with self._conn.transaction():
                yield self._conn
        except psycopg.errors.RaiseException as e:
            raise RouteError(e.diag.message_primary or str(e)) from e
        except psycopg.errors.CheckViolation as e:
            raise RefusedWriteError(e.diag.message_primary or str(e)) from e
        except psycopg.OperationalError as e:
            raise NextminiError(f"database: {e}") from e

    def _find_topology(self, wanted: str | None) -> tuple[int, str]:
        """`wanted` is a topology's key (``namespace/name``) or, when only one
        namespace holds that name, its bare name."""
        with self._transaction() as conn:
            rows = conn.execute("SELECT id, key, name FROM topologies ORDER BY key").fetchall()
        keys = [key for _, key, _ in rows]
        if wanted is not None:
            exact = [(i, key) for i, key, _ in rows if key == wanted]
            by_name = [(i, key) for i, key, name in rows if name == wanted]
            if exact:
                return exact[0]
            if len(by_name) == 1:
                return by_name[0]
            if by_name:
                raise NextminiError(
                    f"several namespaces hold a topology {wanted!r} "
                    f"({', '.join(key for _, key in by_name)}); pass topology='namespace/name'"
                )
            raise NotFoundError(f"no topology {wanted!r} in the database; {_listing('topologies', keys)}")
        if len(rows) == 1:
            return rows[0][0], rows[0][1]
        if not rows:
            raise NotFoundError(
                "the database holds no topology yet (bring one up with `nextmini up -f FILE`)"
            )
        raise NextminiError(f"the database holds several topologies ({', '.join(keys)}); pass topology=")

    def _params(self, **values: Any) -> dict[str, Any]:
        return {"t": self._topology_id, **values}

    # -- reading ---------------------------------------------------------

    def generation(self) -> int:
        """The topology's generation: it grows with every committed change of desired state."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT generation FROM topologies WHERE id = %(t)s", self._params()
            ).fetchone()
        if row is None:
            raise NotFoundError(f"topology {self.topology!r} no longer exists")
        return int(row[0])

    def nodes(self) -> list[Node]:
        """Every node with its agent's stream state, in planning order."""
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT name, overlay_addr, agent_state, state_changed_at FROM nodes"
                " WHERE topology_id = %(t)s ORDER BY idx, name",
                self._params(),
            ).fetchall()
        return [Node(*row) for row in rows]

    def links(self) -> list[Link]:
        """Every link with its parameters and latest measurements, by name."""
        return self._links(None)

    def link(self, name: str) -> Link:
        """One link by name (NotFoundError names the existing links)."""
        found = self._links(name)
        if not found:
            raise NotFoundError(f"no link {name!r} in topology {self.topology}; {self._link_listing()}")
        return found[0]

    def _links(self, name: str | None) -> list[Link]:
        link_query = (
            "SELECT name, dialer, acceptor, transport, params_forward, params_backward"
            " FROM links WHERE topology_id = %(t)s"
        )
        sample_query = _LATEST_SAMPLES
        if name is not None:
            link_query += " AND name = %(name)s"
            sample_query += " AND r.link = %(name)s"
        with self._transaction() as conn:
            params = self._params(name=name)
            rows = conn.execute(link_query + " ORDER BY name", params).fetchall()
            samples = conn.execute(sample_query + " ORDER BY r.link, r.node, r.at DESC", params).fetchall()
        by_link: dict[str, dict[str, Sequence[Any]]] = {}
        for sample in samples:
            by_link.setdefault(sample[0], {})[sample[1]] = sample
        return [assemble_link(row, by_link.get(row[0], {})) for row in rows]

    def metrics(self, link: str | None = None, since: timedelta = timedelta(minutes=1)) -> list[LinkRate]:
        """Rows of the link_rates view from the last `since`, oldest first.

        Rates come from consecutive samples of one reporter, so a reporter's first
        sample has no rate (None) and a counter reset gives one negative rate.
        """
        query = _RATES_COLUMNS
        if link is not None:
            query += " AND link = %(link)s"
        with self._transaction() as conn:
            rows = conn.execute(
                query + " ORDER BY at, link, node", self._params(since=since, link=link)
            ).fetchall()
        return [LinkRate(*row) for row in rows]

    def utilisation(self, link: str, direction: Direction) -> float | None:
        """Latest sent rate over configured rate_bps of one direction of a link.

        None when that direction is unshaped (no rate to compare with) or has no
        rate sample yet.
        """
        return self.link(link).utilisation(check_direction(direction))

    def routes(self) -> list[Route]:
        """Every explicit route with the rules that use it, by id."""
        with self._transaction() as conn:
            routes = conn.execute(
                "SELECT id, name, path FROM routes WHERE topology_id = %(t)s ORDER BY id", self._params()
            ).fetchall()
            rules = conn.execute(
                "SELECT id, src, dst, protocol, src_port, dst_port, route_id, weight"
                " FROM route_rules WHERE topology_id = %(t)s ORDER BY id",
                self._params(),
            ).fetchall()
        by_route: dict[int, list[Rule]] = {}
        for rule_id, src, dst, protocol, src_port, dst_port, route_id, weight in rules:
            rule = Rule(rule_id, Match(src, dst, protocol, src_port, dst_port), route_id, weight)
            by_route.setdefault(route_id, []).append(rule)
        return [Route(rid, name, tuple(path), tuple(by_route.get(rid, ()))) for rid, name, path in routes]

    def paths_for(
        self,
        src: str,
        dst: str,
        *,
        protocol: ProtocolArg = None,
        src_port: int | None = None,
        dst_port: int | None = None,
    ) -> list[tuple[tuple[str, ...], int]]:
        """The (path, weight) pairs that exactly this match is routed over.

        Empty means no rule: the traffic takes the default shortest path.
        """
        match = Match.of(src, dst, protocol=protocol, src_port=src_port, dst_port=dst_port)
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT r.path, rr.weight FROM routes r JOIN"
                " (SELECT route_id, weight, id FROM route_rules WHERE " + _MATCH_WHERE + ") rr"
                " ON r.topology_id = %(t)s AND r.id = rr.route_id ORDER BY rr.id",
                self._match_params(match),
            ).fetchall()
        return [(tuple(path), weight) for path, weight in rows]

    # -- writing ---------------------------------------------------------

    def set_route(
        self,
        src: str,
        dst: str,
        path: Sequence[str],
        *,
        protocol: ProtocolArg = None,
        src_port: int | None = None,
        dst_port: int | None = None,
    ) -> int:
        """Sends the traffic of exactly this match along `path`; returns the route id.

        The route row for `path` is reused when it exists, else created with the
        smallest free id. The match's rules are replaced by one rule of weight 1.
        Writing what is already there changes nothing (no new generation).
        """
        match = Match.of(src, dst, protocol=protocol, src_port=src_port, dst_port=dst_port)
        return self._replace_rules(match, [(path, 1)])[0]

    def set_multipath(
        self,
        src: str,
        dst: str,
        paths_with_weights: PathWeights,
        *,
        protocol: ProtocolArg = None,
        src_port: int | None = None,
        dst_port: int | None = None,
    ) -> list[int]:
        """Splits the traffic of exactly this match over paths by weight (per flow).

        `paths_with_weights` is a sequence of (path, weight) with positive integer
        weights and distinct paths. Returns the route ids in the same order.
        """
        match = Match.of(src, dst, protocol=protocol, src_port=src_port, dst_port=dst_port)
        entries = [(list(path), weight) for path, weight in paths_with_weights]
        if not entries:
            raise ValueError("set_multipath needs at least one path (use clear_routes to remove rules)")
        seen = set()
        for path, weight in entries:
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise ValueError(
                    f"weight of path {graph.path_name(path)} must be a positive integer, not {weight!r}"
                )
            if tuple(path) in seen:
                raise ValueError(f"path {graph.path_name(path)} is given twice; add its weights instead")
            seen.add(tuple(path))
        return self._replace_rules(match, entries)

    def clear_routes(
        self,
        src: str,
        dst: str,
        *,
        protocol: ProtocolArg = None,
        src_port: int | None = None,
        dst_port: int | None = None,
        every_match: bool = False,
    ) -> int:
        """Removes the rules of exactly this match, so it takes the shortest path again.

        With every_match=True, removes every rule from src to dst whatever its
        protocol and ports. Returns how many rules were removed. Route rows stay
        (see prune_routes).
        """
        match = Match.of(src, dst, protocol=protocol, src_port=src_port, dst_port=dst_port)
        if every_match:
            query = "DELETE FROM route_rules WHERE topology_id = %(t)s AND src = %(src)s AND dst = %(dst)s"
        else:
            query = "DELETE FROM route_rules WHERE " + _MATCH_WHERE
        with self._transaction() as conn:
            return conn.execute(query, self._match_params(match)).rowcount

    def prune_routes(self) -> int:
        """Deletes routes no rule uses; returns how many.

        set_route never deletes the route it moves traffic away from: a route id is
        the label in the frames still in flight, and reusing it at once for another
        path could misroute them. Prune when the network is quiet.
        """
        with self._transaction() as conn:
            return conn.execute(
                "DELETE FROM routes r WHERE r.topology_id = %(t)s AND NOT EXISTS"
                " (SELECT 1 FROM route_rules rr WHERE rr.topology_id = r.topology_id AND rr.route_id = r.id)",
                self._params(),
            ).rowcount

    def set_link(self, name: str, *, direction: str = "both", **params: Any) -> None:
        """Merges `params` into a link's parameters (jsonb ||) for one or both directions.

        Top-level keys are replaced (e.g. rate_bps=20_000_000, loss_ppm=0); a nested
        object such as ``queue`` is replaced whole. The agents apply the change in
        place; connections and flows survive it.

        The merged parameters are checked with the database's own rules before the
        write (``nextmini_link_params_problem``, the rules the links trigger and the
        hub apply), so a bad value raises `LinkParamsError` with the database's
        message, e.g. ``links s-y: params_forward.rate_bps: must be an integer or
        null, got "abc"``, and nothing is written.
        """
        if direction not in ("both", "forward", "backward"):
            raise ValueError(f"direction must be 'both', 'forward' or 'backward', not {direction!r}")
        if not params:
            raise ValueError("set_link needs at least one parameter, e.g. rate_bps=20_000_000")
        columns = [
            column
            for column, wanted in (
                ("params_forward", direction in ("both", "forward")),
                ("params_backward", direction in ("both", "backward")),
            )
            if wanted
        ]
        try:
            payload = Jsonb(params)
            json.dumps(params)
        except (TypeError, ValueError) as e:
            raise LinkParamsError(
                f"links {name}: parameters must be JSON values: {e}", link=name, column=columns[0]
            ) from e
        with self._transaction() as conn:
            current = conn.execute(
                "SELECT params_forward, params_backward FROM links"
                " WHERE topology_id = %(t)s AND name = %(name)s FOR UPDATE",
                self._params(name=name),
            ).fetchone()
            if current is None:
                raise NotFoundError(f"no link {name!r} in topology {self.topology}; {self._link_listing()}")
            for column in columns:
                merged = {**(current[0] if column == "params_forward" else current[1]), **params}
                (problem,) = conn.execute(
                    "SELECT nextmini_link_params_problem(%(t)s, %(p)s, %(c)s)",
                    self._params(p=Jsonb(merged), c=column),
                ).fetchone()
                if problem is not None:
                    raise LinkParamsError(f"links {name}: {problem}", link=name, column=column)
            try:
                conn.execute(
                    "UPDATE links SET"
                    " params_forward = CASE WHEN %(fwd)s THEN params_forward || %(p)s ELSE params_forward END,"
                    " params_backward = CASE WHEN %(bwd)s THEN params_backward || %(p)s ELSE params_backward END"
                    " WHERE topology_id = %(t)s AND name = %(name)s",
                    self._params(
                        name=name,
                        p=payload,
                        fwd="params_forward" in columns,
                        bwd="params_backward" in columns,
                    ),
                )
            except psycopg.errors.CheckViolation as e:
                message = e.diag.message_primary or str(e)
                column = "params_backward" if "params_backward" in message else columns[0]
                raise LinkParamsError(message, link=name, column=column) from e

    def _match_params(self, match: Match) -> dict[str, Any]:
        return self._params(
            src=match.src,
            dst=match.dst,
            protocol=match.protocol,
            src_port=match.src_port,
            dst_port=match.dst_port,
        )

    def _replace_rules(self, match: Match, entries: Sequence[tuple[Sequence[str], int]]) -> list[int]:
        """Makes the rules of `match` exactly `entries` (path, weight), in one transaction.

        The topology row is locked first, so concurrent writers cannot pick the
        same free route id; the trigger would update that row anyway.
        """
        for path, _ in entries:
            if len(path) < 2 or path[0] != match.src or path[-1] != match.dst:
                raise RouteError(
                    f"route {graph.path_name(path)}: path does not run from {match.src} to {match.dst}"
                )
        with self._transaction() as conn:
            self._lock_topology(conn)
            ids = [self._route_id(conn, list(path)) for path, _ in entries]
            wanted = sorted(zip(ids, (weight for _, weight in entries)))
            params = self._match_params(match)
            existing = conn.execute(
                "SELECT route_id, weight FROM route_rules WHERE "
                + _MATCH_WHERE
                + " ORDER BY route_id, weight",
                params,
            ).fetchall()
            if [tuple(row) for row in existing] != wanted:
                conn.execute("DELETE FROM route_rules WHERE " + _MATCH_WHERE, params)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO route_rules"
                        " (topology_id, src, dst, protocol, src_port, dst_port, route_id, weight)"
                        " VALUES (%(t)s, %(src)s, %(dst)s, %(protocol)s, %(src_port)s, %(dst_port)s,"
                        " %(route_id)s, %(weight)s)",
                        [{**params, "route_id": rid, "weight": weight} for rid, weight in wanted],
                    )
        return ids

    def _lock_topology(self, conn: psycopg.Connection) -> None:
        row = conn.execute(
            "SELECT 1 FROM topologies WHERE id = %(t)s FOR NO KEY UPDATE", self._params()
        ).fetchone()
        if row is None:
            raise NotFoundError(f"topology {self.topology!r} no longer exists")

    def _route_id(self, conn: psycopg.Connection, path: list[str]) -> int:
        """The id of the route for `path`, creating it with the smallest free id."""
        params = self._params(path=path)
        row = conn.execute(
            "SELECT id FROM routes WHERE topology_id = %(t)s AND path = %(path)s::text[] ORDER BY id LIMIT 1",
            params,
        ).fetchone()
        if row is not None:
            return int(row[0])
        free = conn.execute(
            "SELECT min(c.id) FROM (SELECT 1 AS id UNION ALL"
            " SELECT id + 1 FROM routes WHERE topology_id = %(t)s) c"
            " WHERE NOT EXISTS (SELECT 1 FROM routes r WHERE r.topology_id = %(t)s AND r.id = c.id)",
            params,
        ).fetchone()
        assert free is not None  # an aggregate always returns one row
        route_id = int(free[0])
        name = graph.path_name(path)
        taken = conn.execute(
            "SELECT 1 FROM routes WHERE topology_id = %(t)s AND name = %(name)s", self._params(name=name)
        ).fetchone()
        if taken is not None:  # node names with '-' can make two paths share a name
            name = f"{name}#{route_id}"
        conn.execute(
            "INSERT INTO routes (topology_id, id, name, path)"
            " VALUES (%(t)s, %(id)s, %(name)s, %(path)s::text[])",
            self._params(id=route_id, name=name, path=path),
        )
        return route_id

    # -- events ----------------------------------------------------------

    def listen(
        self,
        channels: str | Iterable[str] = (METRICS_CHANNEL,),
        timeout: float | None = None,
        *,
        all_topologies: bool = False,
    ) -> Listener:
        """Starts listening now; iterate the result for (channel, payload) pairs.

        Iteration ends after `timeout` seconds (None: never). Only events about this
        topology are passed on unless all_topologies=True. Use it as a context
        manager so the listening connection is closed.
        """
        return Listener(
            self.dsn, channels, topology=None if all_topologies else self.topology, timeout=timeout
        )

    def wait_for_metrics(self, timeout: float | None = None) -> bool:
        """Waits until new metrics of this topology are stored; False if `timeout` passed first.

        The first call starts listening and later calls keep the same listener, so
        nothing stored between two calls is missed; a burst counts once.
        """
        if self._metrics_listener is None:
            self._metrics_listener = self.listen((METRICS_CHANNEL,))
        events: list[Event] = self._metrics_listener.wait(timeout)
        return bool(events)

    # -- graph -----------------------------------------------------------

    def _link_ends(self) -> list[graph.Edge]:
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT name, dialer, acceptor FROM links WHERE topology_id = %(t)s ORDER BY name",
                self._params(),
            ).fetchall()
        return [graph.Edge(*row) for row in rows]

    def _check_names(
        self, links: list[graph.Edge], nodes: Iterable[str], avoid_links: Collection[str]
    ) -> None:
        """A typo in a node or link name must not read as "no path"."""
        known_nodes = {n for link in links for n in (link.dialer, link.acceptor)}
        known_nodes.update(node.name for node in self.nodes())
        for node in nodes:
            if node not in known_nodes:
                raise NotFoundError(
                    f"no node {node!r} in topology {self.topology}; {_listing('nodes', sorted(known_nodes))}"
                )
        names = [link.name for link in links]
        for name in avoid_links:
            if name not in names:
                raise NotFoundError(
                    f"no link {name!r} in topology {self.topology}; {_listing('links', names)}"
                )

    def paths(
        self,
        src: str,
        dst: str,
        *,
        avoid_links: Collection[str] = (),
        avoid_nodes: Collection[str] = (),
        max_paths: int = 8,
    ) -> list[list[str]]:
        """Up to `max_paths` loop-free paths from src to dst, fewest hops first."""
        links = self._link_ends()
        self._check_names(links, [src, dst, *avoid_nodes], avoid_links)
        return graph.simple_paths(
            links, src, dst, avoid_links=avoid_links, avoid_nodes=avoid_nodes, max_paths=max_paths
        )

    def shortest_path(
        self,
        src: str,
        dst: str,
        avoid_links: Collection[str] = (),
        *,
        avoid_nodes: Collection[str] = (),
    ) -> list[str] | None:
        """The path with fewest hops (ties broken by link name), or None if none is left."""
        links = self._link_ends()
        self._check_names(links, [src, dst, *avoid_nodes], avoid_links)
        return graph.shortest_path(links, src, dst, avoid_links=avoid_links, avoid_nodes=avoid_nodes)

    def _link_listing(self) -> str:
        return _listing("links", [link.name for link in self._link_ends()])


def _listing(what: str, names: Sequence[str]) -> str:
    """ "links: a-b, b-c" for error messages, or "there are no links"."""
    return f"{what}: {', '.join(names)}" if names else f"there are no {what}"
