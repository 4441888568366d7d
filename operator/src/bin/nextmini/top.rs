//! `nextmini top`: per-link load of running topologies, refreshed live from the
//! metrics history in PostgreSQL. Busiest directions first.

use crate::local::Local;
use crossterm::event::{self, Event, KeyCode, KeyModifiers};
use crossterm::{cursor, execute, terminal};
use nextmini_operator::observe::format;
use nextmini_operator::observe::load::{self, DirectionLoad, TopologyLoad};
use std::io::{IsTerminal, Write};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Topologies to show (default: all).
    topologies: Vec<String>,
    /// Seconds between refreshes.
    #[arg(short = 'n', long, default_value_t = 1.0)]
    interval: f64,
    /// Print one frame and exit (what happens anyway when stdout is not a terminal).
    #[arg(long)]
    once: bool,
}

pub async fn top(local: &Local, args: TopArgs) -> anyhow::Result<i32> {
    let store = crate::tools::running_store(local).await?;
    let interval = Duration::try_from_secs_f64(args.interval)
        .ok()
        .filter(|d| *d >= Duration::from_millis(100))
        .ok_or_else(|| anyhow::anyhow!("--interval must be at least 0.1 seconds"))?;
    let frame = || async {
        let names = if args.topologies.is_empty() {
            load::topology_names(&store).await?
        } else {
            args.topologies.clone()
        };
        let mut loads = Vec::with_capacity(names.len());
        for name in &names {
            match load::load(&store, name).await? {
                Some(l) => loads.push(l),
                None if args.topologies.is_empty() => {}
                None => anyhow::bail!("no topology named {name}"),
            }
        }
        Ok::<_, anyhow::Error>(loads)
    };
    if args.once || !std::io::stdout().is_terminal() {
        print!("{}", render(&frame().await?, usize::MAX));
        return Ok(0);
    }
    let mut out = std::io::stdout();
    let _screen = Screen::enter(&mut out)?;
    loop {
        // A terminal that does not know its size reports 0 columns.
        let width = terminal::size()
            .ok()
            .map(|(w, _)| usize::from(w))
            .filter(|w| *w >= 20)
            .unwrap_or(usize::MAX);
        let text = render(&frame().await?, width);
        execute!(
            out,
            cursor::MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All)
        )?;
        // Raw mode: a newline does not return the carriage.
        out.write_all(text.replace('\n', "\r\n").as_bytes())?;
        out.flush()?;
        if tokio::task::block_in_place(|| wait_for_quit(interval))? {
            return Ok(0);
        }
    }
}

/// Waits up to `interval` for a key; true when it asks to quit.
fn wait_for_quit(interval: Duration) -> std::io::Result<bool> {
    let deadline = std::time::Instant::now() + interval;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || !event::poll(left)? {
            return Ok(false);
        }
        match event::read()? {
            Event::Key(k) => {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                    return Ok(true);
                }
            }
            // Redraw at the new size now rather than at the next tick.
            Event::Resize(..) => return Ok(false),
            _ => {}
        }
    }
}

/// The alternate screen in raw mode with a hidden cursor, restored on drop:
/// also when `top` fails or panics.
struct Screen;

impl Screen {
    fn enter(out: &mut std::io::Stdout) -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        execute!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

struct Row<'a> {
    link: &'a str,
    from: &'a str,
    to: &'a str,
    up: bool,
    d: &'a DirectionLoad,
}

/// One screen: per topology, every link direction, busiest first. Lines are
/// cut at `width` so nothing wraps.
pub fn render(loads: &[TopologyLoad], width: usize) -> String {
    let mut out = String::new();
    if loads.is_empty() {
        out.push_str("no topologies are running\n");
    }
    for t in loads {
        let up = t.links.iter().filter(|l| l.up).count();
        let ready = t
            .nodes
            .iter()
            .filter(|n| n.agent_state == "connected")
            .count();
        let total: f64 = t
            .links
            .iter()
            .flat_map(|l| [l.forward.rate_bps, l.backward.rate_bps])
            .flatten()
            .sum();
        out.push_str(&format!(
            "topology {}  generation {}  agents {ready}/{}  links up {up}/{}  total {}\n",
            t.name,
            t.generation,
            t.nodes.len(),
            t.links.len(),
            format::rate(total)
        ));
        out.push_str(&format!(
            "{:<14} {:<22} {:<5} {:>14} {:<12} {:>5} {:>13} {:>7} {:>8} {:>9}\n",
            "LINK", "DIRECTION", "STATE", "RATE", "UTIL", "", "SHAPED", "QUEUE", "DROPS/s", "RTT"
        ));
        let mut rows: Vec<Row> = t
            .links
            .iter()
            .flat_map(|l| {
                [
                    Row {
                        link: &l.name,
                        from: &l.dialer,
                        to: &l.acceptor,
                        up: l.up,
                        d: &l.forward,
                    },
                    Row {
                        link: &l.name,
                        from: &l.acceptor,
                        to: &l.dialer,
                        up: l.up,
                        d: &l.backward,
                    },
                ]
            })
            .collect();
        rows.sort_by(|a, b| {
            b.d.rate_bps
                .unwrap_or(-1.0)
                .total_cmp(&a.d.rate_bps.unwrap_or(-1.0))
                .then(a.link.cmp(b.link))
        });
        for r in rows {
            let util = r.d.utilisation();
            out.push_str(&format!(
                "{:<14} {:<22} {:<5} {:>14} {:<12} {:>5} {:>13} {:>7} {:>8} {:>9}\n",
                clip(r.link, 14),
                clip(&format!("{} → {}", r.from, r.to), 22),
                if r.up { "up" } else { "down" },
                r.d.rate_bps.map(format::rate).unwrap_or_else(|| "-".into()),
                util.map(|u| format::bar(u, 10)).unwrap_or_default(),
                util.map(|u| format!("{:.0}%", u * 100.0))
                    .unwrap_or_default(),
                r.d.configured_bps
                    .map(|c| format::rate(c as f64))
                    .unwrap_or_else(|| "unlimited".into()),
                r.d.queue_packets,
                r.d.drops_per_sec
                    .map(|d| format!("{d:.1}"))
                    .unwrap_or_else(|| "-".into()),
                r.d.rtt_us
                    .map(|us| format!("{:.2} ms", us as f64 / 1000.0))
                    .unwrap_or_else(|| "-".into()),
            ));
        }
        out.push('\n');
    }
    out.push_str("q or Ctrl-C quits · rates from the last two agent reports in PostgreSQL\n");
    out.lines()
        .map(|l| clip(l, width))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        s.chars()
            .take(width.saturating_sub(1))
            .chain(['…'])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nextmini_operator::observe::load::{LinkLoad, NodeInfo};

    #[test]
    fn busiest_direction_first_and_lines_fit() {
        let dir = |rate: Option<f64>| DirectionLoad {
            rate_bps: rate,
            configured_bps: Some(10_000_000),
            connected: true,
            ..DirectionLoad::default()
        };
        let t = TopologyLoad {
            name: "line3".into(),
            generation: 4,
            nodes: vec![NodeInfo {
                name: "a".into(),
                overlay: "198.18.0.1".into(),
                agent_state: "connected".into(),
            }],
            links: vec![LinkLoad {
                name: "a-b".into(),
                dialer: "a".into(),
                acceptor: "b".into(),
                transport: "tcp".into(),
                up: true,
                forward: dir(Some(1e6)),
                backward: dir(Some(9e6)),
            }],
        };
        let text = render(std::slice::from_ref(&t), usize::MAX);
        let b_to_a = text.find("b → a").expect("b → a row");
        let a_to_b = text.find("a → b").expect("a → b row");
        assert!(b_to_a < a_to_b, "busiest first:\n{text}");
        assert!(
            text.contains("90%") && text.contains("total 10.00 Mbit/s"),
            "{text}"
        );
        let narrow = render(&[t], 40);
        assert!(narrow.lines().all(|l| l.chars().count() <= 40), "{narrow}");
    }
}
