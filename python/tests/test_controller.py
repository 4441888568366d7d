"""The Controller against a real PostgreSQL with the project's schema and triggers."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest

import pgserver
from conftest import TOPOLOGY, insert_rate, insert_sample, insert_topology
import nextmini
from nextmini import Controller, LinkParamsError, NextminiError, NotFoundError, RouteError
from nextmini import events as events_module

_REASON = pgserver.unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture
def ctl(dsn, db):
    with Controller(dsn) as controller:
        yield controller


def generation(db) -> int:
    return db.execute("SELECT generation FROM topologies WHERE name = %s", (TOPOLOGY,)).fetchone()[0]


def rules(db):
    return db.execute(
        "SELECT src, dst, protocol, src_port, dst_port, route_id, weight FROM route_rules ORDER BY route_id"
    ).fetchall()


# -- connecting ----------------------------------------------------------------


def test_the_only_topology_is_the_default(ctl):
    assert ctl.topology == TOPOLOGY


def test_several_topologies_need_a_name(dsn, db):
    insert_topology(db, "line3")
    with pytest.raises(NextminiError, match=r"several topologies \(diamond, line3\)"):
        Controller(dsn)
    with Controller(dsn, "line3") as ctl:
        assert ctl.topology == "line3"
    with pytest.raises(NotFoundError, match="no topology 'ring'.*topologies: diamond, line3"):
        Controller(dsn, "ring")


def test_same_name_in_two_namespaces_is_told_apart_by_key(dsn, db):
    insert_topology(db, "wan", namespace="team-a")
    team_b = insert_topology(db, "wan", namespace="team-b")
    with Controller(dsn, "team-b/wan") as ctl:
        assert ctl.topology == "team-b/wan"
        with ctl.listen(["nextmini_nodes"]) as events:
            # The same node of the other team's "wan" is not this topology's news.
            db.execute(
                "UPDATE nodes SET agent_state = 'disconnected' WHERE name = 'b' AND topology_id <> %s",
                (team_b,),
            )
            db.execute(
                "UPDATE nodes SET agent_state = 'disconnected' WHERE name = 'b' AND topology_id = %s",
                (team_b,),
            )
            assert events.wait(5) == [("nextmini_nodes", "team-b/wan/b disconnected")]
    with pytest.raises(NextminiError, match=r"several namespaces hold a topology 'wan' \(team-a/wan, team-b/wan\)"):
        Controller(dsn, "wan")
    assert events_module.parse_node_event("team-b/wan/b up") == ("team-b/wan", "b", "up")


def test_dsn_comes_from_the_cli_when_not_given(pg, db, monkeypatch):
    monkeypatch.delenv("NEXTMINI_DATABASE_URL", raising=False)
    monkeypatch.setenv("NEXTMINI_BIN", str(pg.binary))
    for key in ("NEXTMINI_STATE_DIR", "NEXTMINI_PG_PORT"):
        monkeypatch.setenv(key, pg.env[key])
    with Controller() as ctl:
        assert ctl.dsn == pg.url
    monkeypatch.setenv("NEXTMINI_DATABASE_URL", pg.url)
    monkeypatch.setenv("NEXTMINI_BIN", "/nonexistent/nextmini")
    with Controller() as ctl:
        assert ctl.topology == TOPOLOGY


def test_no_transaction_stays_open_between_calls(ctl):
    ctl.links()
    ctl.routes()
    assert ctl._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


# -- reading -------------------------------------------------------------------


def test_nodes_and_links_as_stored(ctl):
    nodes = ctl.nodes()
    assert [(n.name, n.overlay_addr, n.agent_state) for n in nodes] == [
        ("a", "198.18.0.1", "pending"),
        ("b", "198.18.0.2", "pending"),
        ("c", "198.18.0.3", "pending"),
        ("d", "198.18.0.4", "pending"),
    ]
    assert nodes[0].state_changed_at is not None
    links = {link.name: link for link in ctl.links()}
    assert sorted(links) == ["a-b", "a-c", "b-d", "d-c"]
    ab = links["a-b"]
    assert (ab.dialer, ab.acceptor, ab.transport) == ("a", "b", "tcp")
    assert ab.params_forward == {"rate_bps": 20_000_000, "delay_us": 1000, "loss_ppm": 0}
    assert ab.connected is None and ab.forward.tx_bps is None  # nothing reported yet


def test_rates_from_two_samples(ctl, db):
    # a sends 10 Mbit/s on a-b (forward); b receives it and sends 1 Mbit/s back.
    insert_rate(db, "a-b", "a", 10_000_000, rx_bps=1_000_000)
    insert_rate(db, "a-b", "b", 1_000_000, rx_bps=10_000_000)
    rows = ctl.metrics("a-b")
    assert [(r.node, r.tx_bps) for r in rows if r.node == "a"] == [
        ("a", None),
        ("a", pytest.approx(10_000_000)),
    ]
    assert len(rows) == 4 and all(r.link == "a-b" and r.connected for r in rows)
    assert ctl.metrics("a-b", since=timedelta(milliseconds=1)) == []
    assert ctl.metrics("b-d") == []
    link = ctl.link("a-b")
    assert link.connected is True
    assert link.forward.tx_bps == pytest.approx(10_000_000)
    assert link.forward.rx_bps == pytest.approx(10_000_000)
    assert link.backward.tx_bps == pytest.approx(1_000_000)
    assert ctl.utilisation("a-b", "forward") == pytest.approx(0.5)
    assert ctl.utilisation("a-b", "backward") == pytest.approx(0.05)
    assert ctl.utilisation("b-d", "forward") is None  # no samples
    insert_rate(db, "a-c", "a", 5_000_000)
    assert ctl.utilisation("a-c", "forward") is None  # unshaped
    with pytest.raises(NotFoundError, match="links: a-b, a-c, b-d, d-c"):
        ctl.utilisation("x-y", "forward")


def test_latest_sample_decides_connected_queue_and_drops(ctl, db):
    insert_rate(db, "b-d", "b", 1_000_000, seconds_ago=5)
    insert_sample(db, "b-d", "b", tx_bytes=10**6, connected=False, drops=7, queue_packets=3)
    insert_sample(db, "b-d", "d", connected=True)
    link = ctl.link("b-d")
    assert link.connected is False
    assert (link.forward.queue_packets, link.forward.drops, link.forward.new_drops) == (3, 7, 7)
    assert link.backward.drops == 0


# -- routes --------------------------------------------------------------------


def test_set_route_creates_route_and_rule_bumps_generation_and_notifies(ctl, db):
    before = generation(db)
    with ctl.listen("nextmini_topology", timeout=5) as events:
        route_id = ctl.set_route("a", "d", ["a", "b", "d"], protocol="tcp", dst_port=5201)
        got = next(iter(events))
    assert got == ("nextmini_topology", TOPOLOGY)
    assert route_id == 1
    assert generation(db) > before
    [route] = ctl.routes()
    assert (route.id, route.name, route.path) == (1, "a-b-d", ("a", "b", "d"))
    [rule] = route.rules
    assert (rule.match.protocol, rule.match.dst_port, rule.match.src_port, rule.weight) == (6, 5201, None, 1)
    assert ctl.paths_for("a", "d", protocol=6, dst_port=5201) == [(("a", "b", "d"), 1)]
    assert ctl.paths_for("a", "d") == []  # a different match


def test_set_route_replaces_the_match_and_reuses_routes(ctl, db):
    ctl.set_route("a", "d", ["a", "b", "d"], protocol="udp")
    ctl.set_route("a", "d", ["a", "b", "d"], dst_port=80)  # another match, same route
    assert rules(db) == [("a", "d", 17, None, None, 1, 1), ("a", "d", None, None, 80, 1, 1)]
    assert ctl.set_route("a", "d", ["a", "c", "d"], protocol=17) == 2
    assert rules(db) == [("a", "d", None, None, 80, 1, 1), ("a", "d", 17, None, None, 2, 1)]
    unchanged = generation(db)
    ctl.set_route("a", "d", ["a", "c", "d"], protocol="udp")
    assert generation(db) == unchanged  # nothing to change, no new snapshot


def test_route_ids_take_the_smallest_free_one(ctl, db):
    ctl.set_route("a", "d", ["a", "b", "d"])
    ctl.set_route("a", "d", ["a", "c", "d"])  # route 1 is now unused
    assert ctl.prune_routes() == 1
    assert [r.id for r in ctl.routes()] == [2]
    assert ctl.set_route("d", "a", ["d", "b", "a"]) == 1
    assert ctl.set_route("b", "c", ["b", "a", "c"]) == 3


def test_invalid_path_raises_route_error_and_writes_nothing(ctl, db):
    ctl.set_route("a", "d", ["a", "b", "d"])
    before = (generation(db), rules(db))
    with pytest.raises(RouteError, match=r"^route a-d: no link between a and d \(path\[0\] to path\[1\]\)$"):
        ctl.set_route("a", "d", ["a", "d"])
    with pytest.raises(RouteError, match="names unknown node x"):
        ctl.set_route("a", "d", ["a", "x", "d"])
    with pytest.raises(RouteError, match="does not run from a to d"):
        ctl.set_route("a", "d", ["a", "b"])
    assert (generation(db), rules(db)) == before
    assert [r.name for r in ctl.routes()] == ["a-b-d"]


def test_set_multipath_writes_weights(ctl, db):
    ctl.set_route("a", "d", ["a", "b", "d"], protocol="tcp")
    ids = ctl.set_multipath("a", "d", [(["a", "b", "d"], 3), (["a", "c", "d"], 1)], protocol="tcp")
    assert ids == [1, 2]
    assert rules(db) == [("a", "d", 6, None, None, 1, 3), ("a", "d", 6, None, None, 2, 1)]
    assert sorted(ctl.paths_for("a", "d", protocol="tcp")) == [(("a", "b", "d"), 3), (("a", "c", "d"), 1)]
    with pytest.raises(ValueError, match="positive integer"):
        ctl.set_multipath("a", "d", [(["a", "b", "d"], 0)])
    with pytest.raises(ValueError, match="given twice"):
        ctl.set_multipath("a", "d", [(["a", "b", "d"], 1), (("a", "b", "d"), 1)])
    with pytest.raises(ValueError):
        ctl.set_multipath("a", "d", [])


def test_clear_routes_removes_exactly_the_match(ctl, db):
    ctl.set_multipath("a", "d", [(["a", "b", "d"], 1), (["a", "c", "d"], 1)], protocol="tcp", dst_port=5201)
    ctl.set_route("a", "d", ["a", "b", "d"])
    before = generation(db)
    assert ctl.clear_routes("a", "d", protocol="tcp") == 0  # no rule has exactly this match
    assert ctl.clear_routes("a", "d", protocol="tcp", dst_port=5201) == 2
    assert generation(db) > before
    assert rules(db) == [("a", "d", None, None, None, 1, 1)]
    assert ctl.clear_routes("a", "d", every_match=True) == 1
    assert rules(db) == []
    assert len(ctl.routes()) == 2  # route rows stay until pruned


# -- links ---------------------------------------------------------------------


def test_set_link_merges_params_and_bumps_generation(ctl, db):
    before = generation(db)
    ctl.set_link("a-b", rate_bps=10_000_000, loss_ppm=500)
    link = ctl.link("a-b")
    assert link.params_forward == {"rate_bps": 10_000_000, "delay_us": 1000, "loss_ppm": 500}
    assert link.params_backward == link.params_forward
    assert generation(db) == before + 1
    ctl.set_link("a-b", direction="backward", rate_bps=1_000_000, queue={"limit_packets": 100})
    link = ctl.link("a-b")
    assert link.params_forward["rate_bps"] == 10_000_000
    assert link.params_backward == {
        "rate_bps": 1_000_000,
        "delay_us": 1000,
        "loss_ppm": 500,
        "queue": {"limit_packets": 100},
    }
    assert generation(db) == before + 2
    ctl.set_link("a-b", direction="forward", rate_bps=10_000_000)
    assert generation(db) == before + 2  # the same values: no change, no snapshot
    with pytest.raises(NotFoundError, match="no link 'x'"):
        ctl.set_link("x", rate_bps=1)
    with pytest.raises(ValueError):
        ctl.set_link("a-b", direction="up", rate_bps=1)
    with pytest.raises(ValueError):
        ctl.set_link("a-b")


@pytest.mark.parametrize(
    ("params", "column", "key", "says"),
    [
        ({"rate_bps": "abc"}, "params_forward", "rate_bps", 'must be an integer or null, got "abc"'),
        ({"rate_bps": -5}, "params_forward", "rate_bps", "must be at least 1, got -5"),
        ({"delay_us": 99_999_999_999}, "params_forward", "delay_us", "must be at most 60000000"),
        ({"loss_ppm": 2_000_000}, "params_forward", "loss_ppm", "must be at most 1000000"),
        ({"rate": 10}, "params_forward", "", "unknown key rate (known keys: burst_bytes"),
        ({"scheduler": "nonsense"}, "params_forward", "scheduler", "must be one of fcfs, wrr, drr, priority, scheme"),
        ({"queue": {"limit_bytes": 100}}, "params_forward", "queue.limit_bytes", "must be at least the MTU (1400 bytes)"),
    ],
)
def test_set_link_refuses_what_the_database_refuses_and_writes_nothing(ctl, db, params, column, key, says):
    before = (generation(db), ctl.link("a-b").params_forward, ctl.link("a-b").params_backward)
    with pytest.raises(LinkParamsError) as refused:
        ctl.set_link("a-b", **params)
    error = refused.value
    assert isinstance(error, nextmini.RefusedWriteError)
    assert (error.link, error.column, error.key) == ("a-b", column, key)
    assert str(error).startswith(f"links a-b: {column}"), str(error)
    assert says in str(error)
    assert (generation(db), ctl.link("a-b").params_forward, ctl.link("a-b").params_backward) == before
    ctl.set_link("a-b", rate_bps=5_000_000)  # a good change still goes through
    assert ctl.link("a-b").params_forward["rate_bps"] == 5_000_000


def test_a_write_around_the_package_gets_the_same_message(ctl, db):
    """The trigger is the rule; the package only asks it first."""
    with pytest.raises(psycopg.errors.CheckViolation, match=r"links a-b: params_backward\.loss_ppm: must be at most 1000000"):
        db.execute(
            "UPDATE links SET params_backward = params_backward || '{\"loss_ppm\": 2000000}' WHERE name = 'a-b'"
        )
    with pytest.raises(nextmini.RefusedWriteError, match="links a-b: column dialer may not change live"):
        with ctl._transaction() as conn:
            conn.execute("UPDATE links SET dialer = 'd' WHERE name = 'a-b'")


def test_values_are_bound_not_formatted(ctl, db):
    evil = "a'; DROP TABLE links; --"
    with pytest.raises(NotFoundError):
        ctl.set_link(evil, rate_bps=1)
    with pytest.raises(LinkParamsError) as refused:
        ctl.set_link("a-b", jitter_distribution=evil)
    assert evil in str(refused.value)  # the value travelled as data, into the message
    assert ctl.link("a-b").params_forward["rate_bps"] == 20_000_000  # and links is still there


# -- events --------------------------------------------------------------------


def test_listen_yields_metrics_of_this_topology(ctl, db):
    insert_topology(db, "other")
    with ctl.listen(timeout=5) as events:
        insert_sample(db, "a-b", "a", topology="other")  # filtered out
        insert_sample(db, "a-b", "a")
        assert next(iter(events)) == ("nextmini_metrics", TOPOLOGY)
        assert events.wait(0.2) == []
    with ctl.listen(timeout=0.2, all_topologies=True) as events:
        insert_sample(db, "a-b", "a", topology="other")
        assert list(events) == [("nextmini_metrics", "other")]


def test_listen_reports_node_state_changes(ctl, db):
    with ctl.listen(["nextmini_nodes"]) as events:
        db.execute("UPDATE nodes SET agent_state = 'disconnected' WHERE name = 'b'")
        assert events.wait(5) == [("nextmini_nodes", f"{TOPOLOGY}/b disconnected")]
    assert events_module.parse_node_event(f"{TOPOLOGY}/b disconnected") == (TOPOLOGY, "b", "disconnected")


def test_wait_for_metrics_keeps_listening_between_calls(ctl, db):
    assert ctl.wait_for_metrics(0.1) is False
    insert_sample(db, "a-b", "a")
    insert_sample(db, "a-b", "b")
    time.sleep(0.3)  # both notifications are pending now: a burst counts once
    assert ctl.wait_for_metrics(5) is True
    assert ctl.wait_for_metrics(0.1) is False


def test_the_psycopg_3_1_fallback_delivers_notifications(dsn, db):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN nextmini_metrics")
        assert list(events_module.poll_notifies(conn, 0.05)) == []
        insert_sample(db, "a-b", "a")
        got = events_module.poll_notifies(conn, 5)
        assert next(got) == ("nextmini_metrics", TOPOLOGY)
        got.close()


# -- graph ---------------------------------------------------------------------


def test_paths_on_the_diamond(ctl):
    assert ctl.paths("a", "d") == [["a", "b", "d"], ["a", "c", "d"]]
    assert ctl.paths("a", "d", avoid_links=["a-b"]) == [["a", "c", "d"]]
    assert ctl.paths("a", "d", max_paths=1) == [["a", "b", "d"]]
    assert ctl.shortest_path("a", "d", ["a-b"]) == ["a", "c", "d"]
    assert ctl.shortest_path("a", "d", avoid_nodes=["b", "c"]) is None
    with pytest.raises(NotFoundError, match="no node 'z'"):
        ctl.paths("a", "z")
    with pytest.raises(NotFoundError, match="no link 'a-z'"):
        ctl.paths("a", "d", avoid_links=["a-z"])


def test_ignores_env_dsn_when_given(dsn, db, monkeypatch):
    monkeypatch.setenv("NEXTMINI_DATABASE_URL", "postgresql:///nowhere?host=/nonexistent")
    with Controller(dsn) as ctl:
        assert ctl.topology == TOPOLOGY
    with pytest.raises(NextminiError, match="cannot connect"):
        Controller()
