"""Pure parts: path search, hop directions, protocol and match parsing, link arithmetic."""

from __future__ import annotations

import pytest

from nextmini import Edge, Link, Match, Traffic, hops, protocol_number, shortest_path, simple_paths, uses_link

DIAMOND = [Edge("a-b", "a", "b"), Edge("a-c", "a", "c"), Edge("b-d", "b", "d"), Edge("d-c", "d", "c")]


def test_diamond_paths_in_hop_order():
    assert simple_paths(DIAMOND, "a", "d") == [["a", "b", "d"], ["a", "c", "d"]]
    assert simple_paths(DIAMOND, "d", "a") == [["d", "b", "a"], ["d", "c", "a"]]
    assert simple_paths(DIAMOND, "b", "c") == [["b", "a", "c"], ["b", "d", "c"]]


def test_avoiding_links_and_nodes():
    assert simple_paths(DIAMOND, "a", "d", avoid_links=["a-b"]) == [["a", "c", "d"]]
    assert simple_paths(DIAMOND, "a", "d", avoid_nodes=["c"]) == [["a", "b", "d"]]
    assert simple_paths(DIAMOND, "a", "d", avoid_links=["a-b", "d-c"]) == []
    assert shortest_path(DIAMOND, "a", "d", avoid_links=["a-b", "a-c"]) is None
    assert shortest_path(DIAMOND, "a", "d", avoid_nodes=["d"]) is None


def test_longer_paths_follow_shorter_ones_and_max_paths_caps():
    ladder = DIAMOND + [Edge("b-c", "b", "c"), Edge("a-d", "a", "d")]
    found = simple_paths(ladder, "a", "d")
    assert found[0] == ["a", "d"]
    assert [len(p) for p in found] == sorted(len(p) for p in found)
    assert ["a", "b", "c", "d"] in found and ["a", "c", "b", "d"] in found
    assert len(found) == 5
    assert simple_paths(ladder, "a", "d", max_paths=2) == [["a", "d"], ["a", "b", "d"]]
    with pytest.raises(ValueError):
        simple_paths(ladder, "a", "d", max_paths=0)


def test_unreachable_destination_returns_quickly():
    # A dense component with an isolated target: without the reachability check the
    # search would enumerate every simple path of the clique.
    clique = [Edge(f"{i}-{j}", str(i), str(j)) for i in range(12) for j in range(i + 1, 12)]
    assert simple_paths(clique + [Edge("x-y", "x", "y")], "0", "x") == []
    assert simple_paths(clique, "0", "nowhere") == []


def test_shortest_path_breaks_ties_by_link_name():
    square = [Edge("2", "a", "b"), Edge("1", "a", "c"), Edge("3", "b", "d"), Edge("4", "c", "d")]
    assert shortest_path(square, "a", "d") == ["a", "c", "d"]
    with pytest.raises(ValueError):
        shortest_path(square, "a", "a")


def test_hops_report_direction_of_travel():
    assert hops(["a", "c", "d"], DIAMOND) == [("a-c", "forward"), ("d-c", "backward")]
    parallel = DIAMOND + [Edge("a-b2", "b", "a"), Edge("a-a", "b", "a")]
    assert hops(["b", "a"], parallel) == [("a-a", "forward")]
    with pytest.raises(ValueError, match="no link between a and d"):
        hops(["a", "d"], DIAMOND)


def test_uses_link_ignores_orientation():
    assert uses_link(["a", "c", "d"], Edge("d-c", "d", "c"))
    assert not uses_link(["a", "b", "d"], Edge("d-c", "d", "c"))


@pytest.mark.parametrize(
    "given, number", [("tcp", 6), ("UDP", 17), ("icmp", 1), (6, 6), ("47", 47), (None, None)]
)
def test_protocol_names_and_numbers(given, number):
    assert protocol_number(given) == number


@pytest.mark.parametrize("bad", ["gre?", 256, -1, True, 6.0])
def test_bad_protocols_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        protocol_number(bad)


def test_match_validation_and_text():
    m = Match.of("a", "d", protocol="tcp", dst_port=5201)
    assert m == Match("a", "d", 6, None, 5201)
    assert str(m) == "a->d tcp dport 5201"
    for bad in (dict(src_port=0), dict(dst_port=70000), dict(dst_port="80")):
        with pytest.raises(ValueError):
            Match.of("a", "d", **bad)
    with pytest.raises(ValueError):
        Match.of("a", "a")


def test_link_utilisation_per_direction():
    link = Link(
        "a-b",
        "a",
        "b",
        "tcp",
        params_forward={"rate_bps": 20_000_000},
        params_backward={"rate_bps": None},
        forward=Traffic(tx_bps=5_000_000),
        backward=Traffic(tx_bps=1_000_000),
    )
    assert link.utilisation("forward") == pytest.approx(0.25)
    assert link.utilisation("backward") is None  # unshaped
    assert link.direction_from("b") == "backward" and link.sender("backward") == "b"
    with pytest.raises(ValueError):
        link.utilisation("up")
