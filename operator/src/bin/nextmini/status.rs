//! `nextmini status`: topologies, nodes, agent streams and bytes per link.

use crate::local::Local;
use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use nextmini_operator::store::TopologyStatusRow;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Topologies to show (default: all).
    topologies: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Format {
    Table,
    Json,
    Yaml,
}

pub async fn status(local: &Local, args: StatusArgs) -> anyhow::Result<i32> {
    let Some(store) = local.existing_store().await? else {
        println!("nothing is running (the private PostgreSQL is stopped)");
        return Ok(0);
    };
    let names = if args.topologies.is_empty() {
        store.topology_names().await?
    } else {
        args.topologies.clone()
    };
    let mut rows = Vec::new();
    for name in &names {
        match store.status(name).await? {
            Some(s) => rows.push(s),
            None => anyhow::bail!("no topology named {name}"),
        }
    }
    let hub = local.hub_pid();
    let loads = crate::observe::loads(&store, &names).await?;
    let metrics = hub.and(nextmini_operator::observe::running_address(
        &local.state_dir,
    ));
    match args.output {
        Format::Json | Format::Yaml => {
            let doc = serde_json::json!({
                "hub": { "pid": hub, "metrics": metrics.map(|a| format!("http://{a}/metrics")) },
                "topologies": crate::observe::with_load(&rows, &loads)?,
            });
            if matches!(args.output, Format::Json) {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print!("{}", serde_norway::to_string(&doc)?);
            }
        }
        Format::Table => {
            match hub {
                Some(pid) => println!(
                    "hub: running (pid {pid}), socket {}{}",
                    local.hub_socket().display(),
                    metrics
                        .map(|a| format!(", metrics http://{a}/metrics"))
                        .unwrap_or_default()
                ),
                None => {
                    println!("hub: not running (agents keep forwarding; `nextmini up` restarts it)")
                }
            }
            if rows.is_empty() {
                println!("no topologies");
            }
            for (t, load) in rows.iter().zip(&loads) {
                print_topology(t, load.as_ref());
            }
        }
    }
    Ok(0)
}

fn print_topology(
    t: &TopologyStatusRow,
    load: Option<&nextmini_operator::observe::load::TopologyLoad>,
) {
    let ready = t
        .nodes
        .iter()
        .filter(|n| n.agent_state == "connected" && n.acked_generation >= t.generation)
        .count();
    let up = t.links.iter().filter(|l| l.connected).count();
    println!(
        "\ntopology {} (generation {}, runtime {}): nodes ready {ready}/{}, links up {up}/{}",
        t.name,
        t.generation,
        t.runtime,
        t.nodes.len(),
        t.links.len()
    );
    let mut nodes = Table::new();
    nodes.load_preset(UTF8_BORDERS_ONLY);
    nodes.set_header(["NODE", "OVERLAY", "UNDERLAY", "STREAM", "PID", "GENERATION"]);
    for n in &t.nodes {
        nodes.add_row([
            n.name.clone(),
            n.overlay_addr.clone(),
            n.underlay_addr.clone(),
            n.agent_state.clone(),
            n.pid.map(|p| p.to_string()).unwrap_or_default(),
            n.acked_generation.to_string(),
        ]);
    }
    println!("{nodes}");
    let mut links = Table::new();
    links.load_preset(UTF8_BORDERS_ONLY);
    links.set_header([
        "LINK",
        "ENDPOINTS",
        "TRANSPORT",
        "STATE",
        "BYTES →",
        "BYTES ←",
        "LOAD →",
        "LOAD ←",
        "DROPS",
    ]);
    for l in &t.links {
        let (fwd, bwd) = crate::observe::load_columns(load, &l.name);
        links.add_row([
            l.name.clone(),
            format!("{} → {}", l.dialer, l.acceptor),
            l.transport.clone(),
            if l.connected { "up" } else { "down" }.to_string(),
            human_bytes(l.bytes_forward),
            human_bytes(l.bytes_backward),
            fwd,
            bwd,
            l.drops.to_string(),
        ]);
    }
    println!("{links}");
    if !t.problems.is_empty() {
        println!(
            "\n{} stored row(s) cannot run as written (written past the database's checks; repair them with SQL):",
            t.problems.len()
        );
        let mut problems = Table::new();
        problems.load_preset(UTF8_BORDERS_ONLY);
        problems.set_header(["ROW", "PROBLEM", "RUNS INSTEAD"]);
        for p in &t.problems {
            problems.add_row([p.subject.clone(), p.problem.clone(), p.consequence.clone()]);
        }
        println!("{problems}");
    }
    print_fidelity(t);
    print_scenario(t);
}

/// The timed scenario: each event's offset, its planned instant, when the
/// last agent it touches applied it, and the worst skew among them.
fn print_scenario(t: &TopologyStatusRow) {
    if t.scenario.is_empty() {
        return;
    }
    let started = t.scenario.iter().find_map(|e| {
        e.planned_at
            .map(|p| p - chrono::Duration::microseconds(e.at_us))
    });
    match started {
        Some(start) => println!(
            "\nscenario (started {}):",
            start.format("%Y-%m-%d %H:%M:%S%.3f UTC")
        ),
        None => println!("\nscenario (starts once every agent runs and every link forwards):"),
    }
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY);
    table.set_header([
        "#",
        "AT",
        "TARGET",
        "CHANGE",
        "PLANNED",
        "APPLIED",
        "WORST SKEW",
        "AGENTS",
        "ERRORS",
    ]);
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or("-".to_string(), |t| t.format("%H:%M:%S%.3f").to_string())
    };
    for e in &t.scenario {
        table.add_row([
            e.idx.to_string(),
            format!("{:.3}s", e.at_us as f64 / 1e6),
            e.target.clone(),
            e.kind.clone(),
            time(e.planned_at),
            time(e.last_applied_at),
            e.worst_skew_us
                .map_or("-".to_string(), |s| format!("{:.3} ms", s as f64 / 1000.0)),
            e.agents.to_string(),
            e.errors.clone(),
        ]);
    }
    println!("{table}");
}

/// The fidelity guard's episodes: when the emulator, not the emulated
/// network, limited a link, the figures of that time measure the emulator.
fn print_fidelity(t: &TopologyStatusRow) {
    if t.unfaithful.is_empty() {
        println!(
            "faithful: no agent saw the emulator limit a link's traffic in the last {} s",
            nextmini_operator::store::FIDELITY_HOLD_SECS
        );
        return;
    }
    println!(
        "
NOT FAITHFUL: the emulator, not the emulated network, limited {} link direction(s) in the last {} s; \
         results measured then may be wrong (give the agents more CPU, or emulate fewer or slower links):",
        t.unfaithful.len(),
        nextmini_operator::store::FIDELITY_HOLD_SECS
    );
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY);
    table.set_header(["LINK", "DIRECTION", "SINCE", "UNTIL", "WHY"]);
    for e in &t.unfaithful {
        table.add_row([
            e.link.clone(),
            format!("{} → {}", e.node, e.peer),
            e.started_at.format("%H:%M:%S").to_string(),
            e.ended_at
                .map_or("ongoing".to_string(), |t| t.format("%H:%M:%S").to_string()),
            e.reason.clone(),
        ]);
    }
    println!("{table}");
}

fn human_bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
