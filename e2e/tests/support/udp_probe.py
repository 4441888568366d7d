#!/usr/bin/env python3
"""UDP probes for the link-fidelity suite: what a link did to each datagram.

    udp_probe.py send HOST COUNT INTERVAL_MS [PORT ...]
    udp_probe.py receive OUT.json IDLE_S PORT [PORT ...]

The sender sends COUNT datagrams per port, round robin over the ports, one
round every INTERVAL_MS. Each datagram carries its sequence number and the
CLOCK_MONOTONIC time it was sent (the namespaces share the clock), padded to
1000 bytes. The receiver listens on the ports until nothing arrives for IDLE_S
seconds after the first datagram, then writes per port: datagrams received,
distinct sequence numbers, those numbers, the one-way delay of each first copy
(ms, in sequence order) and the bytes received.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time

SIZE = 1000
HEADER = struct.Struct("!IQ")


def send(host: str, count: int, interval_ms: float, ports: list[int]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    padding = b"\0" * (SIZE - HEADER.size)
    start = time.monotonic()
    for seq in range(count):
        due = start + seq * interval_ms / 1000.0
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        for port in ports:
            sock.sendto(HEADER.pack(seq, time.monotonic_ns()) + padding, (host, port))


def receive(out: str, idle_s: float, ports: list[int]) -> None:
    selector = selectors.DefaultSelector()
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind(("0.0.0.0", port))
        selector.register(sock, selectors.EVENT_READ, port)
    stats = {p: {"received": 0, "bytes": 0, "delays": {}} for p in ports}
    print("ready", flush=True)
    last = None
    while True:
        timeout = None if last is None else max(0.0, last + idle_s - time.monotonic())
        events = selector.select(timeout)
        if not events:
            break
        for key, _ in events:
            data = key.fileobj.recv(65536)
            now = time.monotonic_ns()
            last = time.monotonic()
            s = stats[key.data]
            s["received"] += 1
            s["bytes"] += len(data)
            if len(data) >= HEADER.size:
                seq, sent = HEADER.unpack_from(data)
                s["delays"].setdefault(seq, (now - sent) / 1e6)
    report = {
        str(p): {
            "received": s["received"],
            "distinct": len(s["delays"]),
            "bytes": s["bytes"],
            "seqs": sorted(s["delays"]),
            "delays_ms": [s["delays"][k] for k in sorted(s["delays"])],
        }
        for p, s in stats.items()
    }
    with open(out, "w") as f:
        json.dump(report, f)


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "send":
        send(argv[1], int(argv[2]), float(argv[3]), [int(p) for p in argv[4:]] or [9000])
        return 0
    if len(argv) >= 4 and argv[0] == "receive":
        receive(argv[1], float(argv[2]), [int(p) for p in argv[3:]])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
