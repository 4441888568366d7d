"""examples/reroute_on_failure.py: planning as pure functions, then runs against the database."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

import pgserver
from conftest import insert_sample, load_example, run_example
from nextmini import Controller, Link, Match, Node, Route, Rule

rr = load_example("reroute_on_failure")

AB, AC = ("a", "b", "d"), ("a", "c", "d")
TCP = Match("a", "d", 6, None, 5201)
ANY = Match("a", "d")


def links(down=()) -> list:
    ends = {"a-b": ("a", "b"), "a-c": ("a", "c"), "b-d": ("b", "d"), "d-c": ("d", "c")}
    return [Link(n, a, b, "tcp", {}, {}, connected=n not in down) for n, (a, b) in ends.items()]


def failures(links=(), nodes=()):
    return rr.Failures(frozenset(links), frozenset(nodes))


def test_failures_come_from_link_reports_and_agent_states():
    now = datetime.now(timezone.utc)
    nodes = [
        Node("a", "x", "connected", now),
        Node("b", "x", "disconnected", now),
        Node("c", "x", "pending", now),
    ]
    ls = links(down=["b-d"]) + [Link("e-f", "e", "f", "tcp", {}, {}, connected=None)]
    assert rr.find_failures(ls, nodes) == failures(["b-d"], ["b"])
    assert not rr.find_failures(links(), nodes[:1])


def test_rules_are_grouped_by_match_in_rule_order():
    routes = [
        Route(1, "a-b-d", AB, (Rule(3, TCP, 1, 2), Rule(1, ANY, 1, 1))),
        Route(2, "a-c-d", AC, (Rule(2, TCP, 2, 1),)),
        Route(3, "unused", ("a", "b"), ()),
    ]
    assert rr.rule_groups(routes) == {ANY: ((AB, 1),), TCP: ((AC, 1), (AB, 2))}


def test_a_broken_path_moves_to_the_shortest_detour():
    [action] = rr.plan_reroutes(
        {TCP: ((AB, 1),), Match("a", "c"): ((("a", "c"), 1),)}, links(), failures(["b-d"])
    )
    assert (action.match, action.old, action.new) == (TCP, ((AB, 1),), ((AC, 1),))
    assert action.describe() == "a->d tcp dport 5201: a-b-d -> a-c-d"


def test_multipath_keeps_working_paths_and_adds_weights():
    [action] = rr.plan_reroutes({TCP: ((AB, 3), (AC, 1))}, links(), failures(["a-b"]))
    assert action.new == ((AC, 4),)


def test_a_failed_transit_node_is_avoided_and_no_detour_clears():
    [action] = rr.plan_reroutes({TCP: ((AB, 1),)}, links(), failures(nodes=["b"]))
    assert action.new == ((AC, 1),)
    [action] = rr.plan_reroutes({TCP: ((AB, 1),)}, links(), failures(["b-d", "d-c"]))
    assert action.new == ()
    assert action.describe() == "a->d tcp dport 5201: a-b-d -> the default shortest path"


def test_nothing_to_do_without_failures_on_the_paths():
    assert rr.plan_reroutes({TCP: ((AB, 1),)}, links(), failures(["d-c"], ["c"])) == []


def test_restore_when_healed_unless_someone_changed_it():
    memory = rr.Memory()
    rr.remember(memory, rr.Action(TCP, ((AB, 1),), ((AC, 1),)))
    rr.remember(memory, rr.Action(TCP, ((AC, 1),), ()))  # a second failure: the original stays
    assert memory.moved[TCP] == (((AB, 1),), ())
    restores, forget = rr.plan_restores(memory, {}, links(), failures(["b-d"]))
    assert (restores, forget) == ([], [])  # still broken
    restores, forget = rr.plan_restores(memory, {}, links(), failures())
    assert [(a.match, a.new) for a in restores] == [(TCP, ((AB, 1),))] and forget == []
    restores, forget = rr.plan_restores(memory, {TCP: ((AC, 7),)}, links(), failures())
    assert (restores, forget) == ([], [TCP])


needs_pg = pytest.mark.skipif(
    pgserver.unavailable_reason() is not None, reason=pgserver.unavailable_reason() or ""
)


@needs_pg
def test_once_moves_routes_off_a_failed_link_and_a_failed_node(dsn, db):
    with Controller(dsn) as ctl:
        ctl.set_route("a", "d", list(AB), protocol="tcp", dst_port=5201)
        ctl.set_route("b", "c", ["b", "a", "c"])
        ctl.set_route("c", "b", ["c", "a", "b"])
    insert_sample(db, "b-d", "d", connected=False)
    insert_sample(db, "b-d", "b", connected=True)
    out = run_example("reroute_on_failure", dsn, "--once")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a->d tcp dport 5201: a-b-d -> a-c-d"]

    db.execute("UPDATE nodes SET agent_state = 'disconnected' WHERE name = 'a'")
    out = run_example("reroute_on_failure", dsn, "--once", "-t", "diamond")
    assert out.returncode == 0, out.stderr
    # with a and b-d gone, b and c have no path left: back to the default
    assert sorted(out.stdout.splitlines()) == [
        "a->d tcp dport 5201: a-c-d -> the default shortest path",
        "b->c: b-a-c -> the default shortest path",
        "c->b: c-a-b -> the default shortest path",
    ]
    with Controller(dsn) as ctl:
        assert all(route.rules == () for route in ctl.routes())


@needs_pg
def test_restore_moves_back_once_the_link_is_up(dsn, db):
    memory = rr.Memory()
    with Controller(dsn) as ctl:
        ctl.set_multipath("a", "d", [(list(AB), 2), (list(AC), 1)])
        insert_sample(db, "a-b", "b", connected=False)
        [moved] = rr.step(ctl, memory, restore=True)
        assert ctl.paths_for("a", "d") == [(AC, 3)]
        assert rr.step(ctl, memory, restore=True) == []  # nothing new
        insert_sample(db, "a-b", "b", connected=True)
        [restored] = rr.step(ctl, memory, restore=True)
        assert restored.new == ((AB, 2), (AC, 1))
        assert sorted(ctl.paths_for("a", "d")) == [(AB, 2), (AC, 1)]
        assert memory.moved == {}


@needs_pg
def test_runs_until_interrupted_and_reacts_to_notifications(dsn, db):
    import signal

    from conftest import read_line, start_example

    with Controller(dsn) as ctl:
        ctl.set_route("a", "d", list(AB))
    proc = start_example("reroute_on_failure", dsn, "--restore")
    try:
        assert "watching topology diamond for failures (restoring)" in read_line(proc.stderr)
        insert_sample(db, "b-d", "b", connected=False)
        assert read_line(proc.stdout) == "a->d: a-b-d -> a-c-d\n"
        insert_sample(db, "b-d", "b", connected=True)
        assert read_line(proc.stdout) == "a->d: a-c-d -> a-b-d\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        rest = proc.stderr.read()
        assert "stopped" in rest and "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
