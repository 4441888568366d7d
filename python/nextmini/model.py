"""The values the Controller returns: plain, immutable dataclasses.

They are detached from the database on purpose: a control algorithm reads a
consistent picture once, decides with pure functions, then writes. Keeping the
decision away from the connection is what makes algorithms unit-testable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

#: A direction of a link: ``forward`` is what the dialer sends to the acceptor,
#: ``backward`` what the acceptor sends back (the schema's params_forward/params_backward).
Direction = Literal["forward", "backward"]
DIRECTIONS: tuple[str, str] = ("forward", "backward")

#: IP protocol names accepted wherever a protocol is; anything else must be a number.
PROTOCOLS: dict[str, int] = {"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "sctp": 132}


def check_direction(direction: str) -> Direction:
    """Returns `direction` if it names one; a typo must not silently pick a side."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'backward', not {direction!r}")
    return cast(Direction, direction)


def protocol_number(protocol: str | int | None) -> int | None:
    """Normalises a protocol given as "tcp"/"udp"/"icmp", a number or a numeric string.

    Route rules store the IP protocol number; accepting names keeps scripts readable.
    """
    if protocol is None:
        return None
    if isinstance(protocol, bool):
        raise TypeError("protocol must be a name or a number, not a bool")
    if isinstance(protocol, str):
        name = protocol.strip().lower()
        if name in PROTOCOLS:
            return PROTOCOLS[name]
        if not name.isdigit():
            known = ", ".join(sorted(PROTOCOLS))
            raise ValueError(f"unknown protocol {protocol!r} (use {known} or a number 0-255)")
        protocol = int(name)
    if not isinstance(protocol, int) or not 0 <= protocol <= 255:
        raise ValueError(f"protocol number must be 0-255, not {protocol!r}")
    return protocol


def protocol_label(number: int | None) -> str:
    """The name of a protocol number for messages ("tcp"), or the number itself."""
    for name, value in PROTOCOLS.items():
        if value == number:
            return name
    return str(number)


def check_port(port: int | None, what: str) -> int | None:
    """Validates a port before the database's CHECK would reject it with a vaguer message."""
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what} must be 1-65535, not {port!r}")
    return port


@dataclass(frozen=True)
class Match:
    """The traffic a route rule applies to: src → dst, optionally narrowed by
    protocol and ports. Rules with equal matches form one (multipath) group."""

    src: str
    dst: str
    protocol: int | None = None
    src_port: int | None = None
    dst_port: int | None = None

    @classmethod
    def of(
        cls,
        src: str,
        dst: str,
        *,
        protocol: str | int | None = None,
        src_port: int | None = None,
        dst_port: int | None = None,
    ) -> Match:
        """Builds a validated match, turning protocol names into numbers."""
        if not src or not dst:
            raise ValueError("src and dst must be node names")
        if src == dst:
            raise ValueError(f"src and dst are the same node {src!r}")
        return cls(
            src,
            dst,
            protocol_number(protocol),
            check_port(src_port, "src_port"),
            check_port(dst_port, "dst_port"),
        )

    def __str__(self) -> str:
        parts = [f"{self.src}->{self.dst}"]
        if self.protocol is not None:
            parts.append(protocol_label(self.protocol))
        if self.src_port is not None:
            parts.append(f"sport {self.src_port}")
        if self.dst_port is not None:
            parts.append(f"dport {self.dst_port}")
        return " ".join(parts)


@dataclass(frozen=True)
class Node:
    """A node and the state of its agent's control stream."""

    name: str
    overlay_addr: str
    #: pending | connected | disconnected (written by the hub)
    agent_state: str
    state_changed_at: datetime


@dataclass(frozen=True)
class Traffic:
    """The latest measurements of one direction of a link.

    The sender of the direction reports tx, queue and drops (its pipeline does the
    queueing); the receiver reports rx. ``None`` means no sample yet: rates need
    two samples of the same reporter.
    """

    tx_bps: float | None = None
    rx_bps: float | None = None
    queue_packets: int | None = None
    #: cumulative drops of the sender's pipeline
    drops: int | None = None
    #: drops between the sender's last two samples
    new_drops: int | None = None
    #: when the sender's latest sample was taken
    at: datetime | None = None


@dataclass(frozen=True)
class Link:
    """A link: its configuration per direction and what was measured on it."""

    name: str
    dialer: str
    acceptor: str
    transport: str
    params_forward: Mapping[str, Any]
    params_backward: Mapping[str, Any]
    #: False when either end's latest report says disconnected, None before any report
    connected: bool | None = None
    forward: Traffic = field(default_factory=Traffic)
    backward: Traffic = field(default_factory=Traffic)

    def params(self, direction: Direction) -> Mapping[str, Any]:
        """The emulation parameters of one direction."""
        return self.params_forward if check_direction(direction) == "forward" else self.params_backward

    def traffic(self, direction: Direction) -> Traffic:
        """The measurements of one direction."""
        return self.forward if check_direction(direction) == "forward" else self.backward

    def sender(self, direction: Direction) -> str:
        """The node that sends in `direction` (and enforces its parameters)."""
        return self.dialer if check_direction(direction) == "forward" else self.acceptor

    def direction_from(self, node: str) -> Direction:
        """The direction of traffic that `node` sends onto this link."""
        if node == self.dialer:
            return "forward"
        if node == self.acceptor:
            return "backward"
        raise ValueError(f"node {node!r} is not an end of link {self.name}")

    def rate_bps(self, direction: Direction) -> int | None:
        """The configured rate of a direction, or None when it is unshaped."""
        rate = self.params(direction).get("rate_bps")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            return None
        return int(rate)

    def utilisation(self, direction: Direction) -> float | None:
        """Latest sent rate over configured rate; None when unshaped or not measured."""
        rate = self.rate_bps(direction)
        tx = self.traffic(direction).tx_bps
        if rate is None or tx is None:
            return None
        return tx / rate


@dataclass(frozen=True)
class Rule:
    """One route rule: traffic matching `match` takes route `route_id` with `weight`."""

    id: int
    match: Match
    route_id: int
    weight: int


@dataclass(frozen=True)
class Route:
    """An explicit route (a node path) and the rules that currently send traffic onto it."""

    id: int
    name: str
    path: tuple[str, ...]
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class LinkRate:
    """One row of the link_rates view: rates between two consecutive samples of one reporter."""

    link: str
    node: str
    at: datetime
    tx_bps: float | None
    rx_bps: float | None
    new_drops: int | None
    queue_packets: int
    rtt_us: int | None
    connected: bool
