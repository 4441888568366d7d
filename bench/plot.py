#!/usr/bin/python3
"""Turns the benchmark results (bench/results/*.json, written by the
e2e/examples/bench_*.rs binaries) into bench/results/hops.png and the generated
section of BENCHMARKS.md between <!-- bench:begin --> and <!-- bench:end -->.

Run by `make bench` after the benchmarks; `bench/plot.py` alone re-renders from
the stored JSON. Needs matplotlib (Debian: python3-matplotlib, which
`scripts/setup.sh --bench` installs). Only the standard library otherwise.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "BENCHMARKS.md"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

PATHS = [
    ("kernel", "kernel forwarding chain", "black", "-"),
    ("tun", "Nextmini TUN (normal mode)", "tab:blue", "-"),
    ("socks_normal", "SOCKS5, normal mode", "tab:green", "-"),
    ("socks_max", "SOCKS5, max mode (splice)", "tab:red", "-"),
    ("loopback", "loopback TCP, no hops", "grey", "--"),
]


def load(name):
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    with path.open() as f:
        return json.load(f)


def mib(n):
    return f"{n / 1048576:.2f} MiB"


def fmt(v, digits=2, unit=""):
    if v is None:
        return "–"
    return f"{v:.{digits}f}{unit}"


def plot_hops(hops):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = hops["rows"]
    xs = [r["hops"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for key, label, color, style in PATHS:
        ys = [r["gbps"].get(key) for r in rows]
        left.plot(xs, ys, style, marker="o", color=color, label=label)
    left.set_xscale("log", base=2)
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_yscale("log")
    values = [v for r in rows for v in r["gbps"].values() if v]
    ticks = [t for t in (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if min(values) / 2 <= t <= max(values) * 2]
    left.set_yticks(ticks, [f"{t:g}" for t in ticks])
    left.minorticks_off()
    left.set_xlabel("hops (links between client node and server node)")
    left.set_ylabel("Gbit/s (median, curl ← python3 http.server)")
    size = hops["size_bytes"] / 1048576
    left.set_title(f"{size:.0f} MiB transfers, median of {hops['repetitions']}")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    ratios = [
        ("tun_vs_kernel", "TUN / kernel chain", "tab:blue"),
        ("socks_normal_vs_kernel", "SOCKS normal / kernel chain", "tab:green"),
        ("socks_max_vs_kernel", "SOCKS max / kernel chain", "tab:orange"),
        ("socks_max_vs_loopback", "SOCKS max / loopback", "tab:red"),
    ]
    for key, label, color in ratios:
        right.plot(xs, [r["ratio"].get(key) for r in rows], marker="o", color=color, label=label)
    targets = hops.get("targets", {})
    if "tun_vs_kernel" in targets:
        right.axhline(targets["tun_vs_kernel"], color="tab:blue", ls=":", label="target TUN ≥ 1.0× kernel")
    if "socks_max_vs_loopback" in targets:
        right.axhline(
            targets["socks_max_vs_loopback"], color="tab:red", ls=":", label="target max ≥ 0.9× loopback"
        )
    right.set_xscale("log", base=2)
    right.set_xticks(xs, [str(x) for x in xs])
    right.set_xlabel("hops")
    right.set_ylabel("ratio (same run)")
    right.set_title("against the baselines")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / "hops.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out.relative_to(ROOT)}")


def verdict(ok):
    return "**met**" if ok else "**missed**"


def offloads(dev):
    o = dev.get("offloads", {})
    short = {"generic-segmentation-offload": "GSO", "tcp-segmentation-offload": "TSO",
             "generic-receive-offload": "GRO"}
    return ", ".join(f"{name} {o.get(key, '?').split()[0]}" for key, name in short.items())


def devices_line(rows):
    """What both sides' devices did with large packets, from the rows that recorded it."""
    described = [r for r in rows if "devices" in r]
    if not described:
        return "Devices (MTU, GSO/GRO) not recorded for these rows."
    d = described[0]["devices"]
    tun, under, veth = d["nextmini"]["n0_tun"], d["nextmini"]["n0_underlay"], d["kernel_chain"]["client"]
    older = len(rows) - len(described)
    return (f"Devices (from bench/results/hops.json): Nextmini's TUN MTU {tun.get('mtu')} ({offloads(tun)}), "
            f"its underlay veth MTU {under.get('mtu')} ({offloads(under)}); "
            f"the kernel chain's veths MTU {veth.get('mtu')} ({offloads(veth)})"
            + (f"; {older} older rows did not record them." if older else "."))


def congestion_line(rows):
    """The end-to-end flows' congestion control on both paths, from the rows that recorded it."""
    seen = sorted({(r["congestion_control"].get("nextmini_n0"), r["congestion_control"].get("kernel_chain"),
                    r["congestion_control"].get("nextmini_links")) for r in rows if "congestion_control" in r})
    if not seen:
        return ""
    return " Congestion control (end-to-end flow in Nextmini / in the kernel chain / Nextmini's link sockets): " + \
        "; ".join(" / ".join(str(x) for x in s) for s in seen) + " (DESIGN.md \"Congestion control on long paths\")."


def section_hops(hops):
    p = hops["provenance"]
    size = hops["size_bytes"] / 1048576
    out = [
        "### Hop scaling (3a)",
        "",
        "```sh",
        "sudo make bench BENCH=hops   # e2e/examples/bench_hops.rs, then bench/plot.py",
        "```",
        "",
        f"{size:.0f} MiB from a tmpfs file, fetched by curl from `python3 -m http.server` in the last node; "
        f"median of {hops['repetitions']} transfers per path, the paths taking turns. "
        f"Gbit/s as curl timed it. Measured {p['measured_at']} at commit {p['git_commit']} "
        f"on {p['cpus']} cores ({p['cpu_model']}, kernel {p['kernel']}). "
        + devices_line(hops["rows"])
        + congestion_line(hops["rows"]),
        "",
        "| hops | kernel chain | TUN | SOCKS normal | SOCKS max | loopback | TUN / kernel | SOCKS normal / kernel | SOCKS max / kernel | SOCKS max / loopback |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in hops["rows"]:
        g, q = r["gbps"], r["ratio"]
        out.append(
            f"| {r['hops']} | {fmt(g.get('kernel'))} | {fmt(g.get('tun'))} | {fmt(g.get('socks_normal'))} "
            f"| {fmt(g.get('socks_max'))} | {fmt(g.get('loopback'))} | {fmt(q.get('tun_vs_kernel'), 2, '×')} "
            f"| {fmt(q.get('socks_normal_vs_kernel'), 2, '×')} | {fmt(q.get('socks_max_vs_kernel'), 2, '×')} "
            f"| {fmt(q.get('socks_max_vs_loopback'), 2, '×')} |"
        )
    t = hops["targets"]
    tun = [r["ratio"]["tun_vs_kernel"] for r in hops["rows"]]
    mx = [r["ratio"]["socks_max_vs_loopback"] for r in hops["rows"]]
    met_max = [str(r["hops"]) for r in hops["rows"] if r["ratio"]["socks_max_vs_loopback"] >= t["socks_max_vs_loopback"]]
    out += [
        "",
        "![Hop scaling: throughput and ratios](bench/results/hops.png)",
        "",
        f"- TUN path ≥ {t['tun_vs_kernel']:.1f}× the kernel chain at every hop count: {verdict(min(tun) >= t['tun_vs_kernel'])} "
        f"({min(tun):.2f}× to {max(tun):.2f}×).",
        f"- Max mode ≥ {t['socks_max_vs_loopback']:.1f}× direct loopback TCP: {verdict(min(mx) >= t['socks_max_vs_loopback'])} "
        f"({min(mx):.2f}× to {max(mx):.2f}×; met at {'hop count(s) ' + ', '.join(met_max) if met_max else 'no hop count'}).",
        "",
    ]
    return out


def section_memory(mem):
    p = mem["provenance"]
    a = mem["agents"]
    target = mem["targets"]["idle_rss_bytes"]
    out = [
        "### Agent memory (3b)",
        "",
        "```sh",
        "sudo make bench BENCH=memory   # e2e/examples/bench_memory.rs",
        "```",
        "",
        f"Median of 5 samples 1 s apart, 3 s after the snapshot was acknowledged; measured {p['measured_at']} at commit {p['git_commit']}. "
        "PSS divides pages shared with other processes (the agent binary's code, libc) among them, so it falls as more agents run; "
        "USS counts only the pages no other process maps.",
        "",
        "| agent | RSS | of which file-backed | of which anonymous | PSS | USS (its own pages) | threads |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in [
        ("idle", "idle: the only node of a topology, no links"),
        ("star_center", "centre of a star: 10 links, connected, each pinged once"),
        ("star_leaf", "leaf of the same star: 1 link (median of 10)"),
    ]:
        m = a[key]
        out.append(
            f"| {label} | {mib(m['rss'])} | {mib(m['rss_file'])} | {mib(m['rss_anon'])} | {mib(m['pss'])} | {mib(m.get('uss', 0))} | {m['threads']} |"
        )
    out += [
        "",
        "Where the idle agent's resident memory is (from /proc/PID/smaps):",
        "",
        "| mapping | resident | of which anonymous |",
        "|---|---|---|",
    ]
    for m in mem["rss_by_mapping"]["idle"]:
        out.append(f"| {m['mapping']} | {mib(m['rss_bytes'])} | {mib(m.get('anonymous_bytes', 0))} |")
    out += [
        "",
        f"- Idle agent ≤ {mib(target)} RSS: {verdict(a['idle']['rss'] <= target)} ({mib(a['idle']['rss'])}; "
        f"anonymous memory alone {mib(a['idle']['rss_anon'])}).",
        "",
    ]
    return out


def section_startup(st):
    p = st["provenance"]
    out = [
        "### Start-up in namespace mode (3c)",
        "",
        "```sh",
        "sudo make bench BENCH=scale   # e2e/examples/bench_scale.rs: start-up, then the fan-out below",
        "```",
        "",
        "`nextmini up` of `generator: {line: {nodes: N}}`, on a terminal (`script`), with PostgreSQL and the hub already running "
        "(a one-node topology stays up). The phases are the first 100 ms sample at which all N namespaces existed, all N agents "
        f"had a recorded pid, were connected to the hub, and had acknowledged. Measured {p['measured_at']} at commit {p['git_commit']}.",
        "",
        "| nodes | `up` returned | all namespaces | all agents started | all connected | all acknowledged | `down` | agent RSS / PSS / USS (median) | PSS of all agents |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in st["rows"]:
        ph = r["phases"]
        m = r["agent_memory"]
        out.append(
            f"| {r['nodes']} | {fmt(r['up_seconds'], 1, ' s')} | {fmt(ph.get('all_namespaces_s'), 1, ' s')} "
            f"| {fmt(ph.get('all_agents_started_s'), 1, ' s')} | {fmt(ph.get('all_connected_s'), 1, ' s')} "
            f"| {fmt(ph.get('all_acknowledged_s'), 1, ' s')} | {fmt(r.get('down_seconds'), 1, ' s')} "
            f"| {mib(m['median']['rss'])} / {mib(m['median']['pss'])} / {mib(m['median'].get('uss', 0))} | {mib(m['total_pss_bytes'])} |"
        )
    out += ["", "Progress bars of `up` as a terminal showed them:", "", "| nodes | bar | redraws that moved it | longest standstill | last position |", "|---|---|---|---|---|"]
    for r in st["rows"]:
        for b in r["progress_bars"]:
            out.append(
                f"| {r['nodes']} | {b['bar']} | {b['moves']} | {fmt(b['longest_standstill_s'], 2, ' s')} | {b['last_position']}/{r['nodes']} |"
            )
    big = [r for r in st["rows"] if r["nodes"] >= 1000]
    target = st["targets"]["up_seconds_1000_nodes"]
    if big:
        r = big[-1]
        out += ["", f"- 1,000 nodes ready ≤ {target:.0f} s: {verdict(r['up_seconds'] <= target)} ({r['up_seconds']:.1f} s)."]
    out.append("")
    return out


def section_fanout(fo):
    p = fo["provenance"]
    out = [
        f"### Control fan-out to {fo['agents']:,} agents (3d)",
        "",
        f"Part of `BENCH=scale`: {len(fo['changes'])} UPDATEs of `links.params_forward` (the rate of link {fo['link_changed']}) of the "
        f"{fo['agents']}-node line, each in its own transaction; from `COMMIT` returning until the `nodes` table shows the new "
        f"generation acknowledged (polled every 2 ms). Measured {p['measured_at']} at commit {p['git_commit']}.",
        "",
        "| agents | first agent (median) | half (median) | all (median) | all (max) |",
        "|---|---|---|---|---|",
        f"| {fo['agents']} | {fmt(fo['median_first_ms'], 1, ' ms')} | {fmt(fo['median_half_ms'], 1, ' ms')} "
        f"| {fmt(fo['median_all_ms'], 1, ' ms')} | {fmt(fo['max_all_ms'], 1, ' ms')} |",
        "",
    ]
    return out


def regenerate_doc(parts):
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{DOC.name}: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = "\n".join(
        ["", "<!-- generated by bench/plot.py from bench/results/*.json; edit those, not this -->", ""] + parts
    )
    DOC.write_text(head + BEGIN + "\n" + body.rstrip("\n") + "\n\n" + END + tail)
    print(f"updated {DOC.name}")


def main():
    parts = []
    hops = load("hops")
    if hops and hops.get("rows"):
        plot_hops(hops)
        parts += section_hops(hops)
    mem = load("memory")
    if mem:
        parts += section_memory(mem)
    st = load("startup")
    if st and st.get("rows"):
        parts += section_startup(st)
    fo = load("fanout")
    if fo:
        parts += section_fanout(fo)
    if not parts:
        sys.exit("no results in bench/results/ yet: run `sudo make bench` first")
    regenerate_doc(parts)


if __name__ == "__main__":
    main()
