"""examples/least_loaded.py: the decision as pure functions, then one run against the database."""

from __future__ import annotations

import pytest

import pgserver
from conftest import insert_rate, load_example, run_example
from nextmini import Controller, Link, Match, Traffic

ll = load_example("least_loaded")

RATE = 20_000_000
ENDS = {"a-b": ("a", "b"), "a-c": ("a", "c"), "b-d": ("b", "d"), "d-c": ("d", "c")}
AB, AC = ("a", "b", "d"), ("a", "c", "d")


def diamond(tx: dict, unshaped=("a-c",)) -> dict:
    """Diamond links; `tx` maps (link, direction) to the sent rate in bit/s."""
    links = {}
    for name, (dialer, acceptor) in ENDS.items():
        params = {} if name in unshaped else {"rate_bps": RATE}
        links[name] = Link(
            name,
            dialer,
            acceptor,
            "tcp",
            params,
            params,
            forward=Traffic(tx_bps=tx.get((name, "forward"))),
            backward=Traffic(tx_bps=tx.get((name, "backward"))),
        )
    return links


def test_path_load_is_the_busiest_hop_in_the_direction_of_travel():
    links = diamond({("d-c", "backward"): 0.7 * RATE, ("d-c", "forward"): 0.1 * RATE})
    load = ll.path_load(AC, links)
    assert (load.load, load.bottleneck) == (pytest.approx(0.7), "d-c")
    assert ll.path_load(("d", "c", "a"), links).load == pytest.approx(0.1)


def test_unshaped_links_count_only_when_their_rate_is_high():
    links = diamond({("a-c", "forward"): 5e8})
    assert ll.path_load(AC, links, unshaped_high_bps=1e9).load == 0.0
    links = diamond({("a-c", "forward"): 2e9})
    assert ll.path_load(AC, links, unshaped_high_bps=1e9).load == pytest.approx(2.0)


def test_moves_away_from_cross_traffic():
    # our flow: 8 Mbit/s along a-b-d; 10 Mbit/s of cross traffic shares a-b.
    links = diamond({("a-b", "forward"): 18e6, ("b-d", "forward"): 8e6})
    decision = ll.decide([AB, AC], AB, links)
    assert decision.move and decision.best.path == AC
    assert decision.current.load == pytest.approx(0.9)
    assert decision.best.load == pytest.approx(0.4)  # d-c would carry our 8 Mbit/s
    assert decision.describe(Match.of("a", "d", protocol="tcp", dst_port=5201)) == (
        "a->d tcp dport 5201: moved from a-b-d (90%) to a-c-d (40%)"
    )


def test_a_lone_flow_does_not_flap_between_idle_paths():
    links = diamond({("a-b", "forward"): 18e6, ("b-d", "forward"): 18e6})
    assert not ll.decide([AB, AC], AB, links).move
    # Judged without its own traffic, the idle path would look 90 points better.
    assert ll.decide([AB, AC], AB, links, self_correct=False).move


def test_hysteresis_margin():
    links = diamond({("a-b", "forward"): 0.5 * RATE, ("d-c", "backward"): 0.45 * RATE})
    assert not ll.decide([AB, AC], AB, links, self_correct=False).move
    assert ll.decide([AB, AC], AB, links, hysteresis=0.01, self_correct=False).move


def test_current_path_outside_the_candidates_is_still_judged():
    links = diamond({("a-c", "forward"): 2e9})
    decision = ll.decide([AB], AC, links, self_correct=False)
    assert decision.move and decision.best.path == AB


def test_own_rate_needs_every_hop_measured():
    assert ll.own_rate(AB, diamond({("a-b", "forward"): 9e6, ("b-d", "forward"): 4e6})) == 4e6
    assert ll.own_rate(AB, diamond({("a-b", "forward"): 9e6})) == 0.0


@pytest.mark.skipif(pgserver.unavailable_reason() is not None, reason=pgserver.unavailable_reason() or "")
def test_once_moves_the_flow_off_the_loaded_path(dsn, db):
    insert_rate(db, "a-b", "a", 18e6)
    insert_rate(db, "b-d", "b", 8e6)
    args = ["--once", "--src", "a", "--dst", "d", "--dst-port", "5201", "--protocol", "tcp"]
    out = run_example("least_loaded", dsn, *args)
    assert out.returncode == 0, out.stderr
    assert "a->d tcp dport 5201: moved from a-b-d (90%) to a-c-d (40%)" in out.stdout
    with Controller(dsn) as ctl:
        assert ctl.paths_for("a", "d", protocol="tcp", dst_port=5201) == [(AC, 1)]
    again = run_example("least_loaded", dsn, *args)  # the same numbers: it stays put
    assert again.returncode == 0 and "moved" not in again.stdout, again.stderr


@pytest.mark.skipif(pgserver.unavailable_reason() is not None, reason=pgserver.unavailable_reason() or "")
def test_bad_arguments_fail_cleanly(dsn, db):
    out = run_example("least_loaded", dsn, "--once", "--src", "a", "--dst", "zz", "--topology", "nope")
    assert out.returncode == 1
    assert "no topology 'nope'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(pgserver.unavailable_reason() is not None, reason=pgserver.unavailable_reason() or "")
def test_runs_on_metrics_notifications_until_terminated(dsn, db):
    import signal

    from conftest import read_line, start_example

    proc = start_example("least_loaded", dsn, "--src", "a", "--dst", "d", "--hold-down", "0")
    try:
        assert "steering a->d in topology diamond" in read_line(proc.stderr)
        with db.transaction():  # one report batch, as the hub writes them
            insert_rate(db, "a-b", "a", 18e6)
            insert_rate(db, "b-d", "b", 8e6)
        assert read_line(proc.stdout) == "a->d: moved from a-b-d (90%) to a-c-d (40%)\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_protocol_or_port_is_a_usage_error():
    parser = ll.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--src", "a", "--dst", "d", "--protocol", "tpc"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--src", "a", "--dst", "d", "--dst-port", "0"])
    args = parser.parse_args(["--src", "a", "--dst", "d", "--protocol", "udp", "--dst-port", "53"])
    assert (args.protocol, args.dst_port) == (17, 53)
