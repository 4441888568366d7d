//! A topology as a picture: Mermaid, Graphviz DOT, or a self-contained HTML
//! page (inline SVG and script, nothing fetched from elsewhere) with each link
//! direction coloured by its utilisation.

use super::format;
use super::load::{DirectionLoad, TopologyLoad};
use serde_json::json;
use std::collections::HashMap;

/// The page; `__NEXTMINI_DATA__` becomes the graph as JSON.
const PAGE: &str = include_str!("graph.html");

/// Node positions in a 1000 × 640 box: a force-directed layout
/// (Fruchterman–Reingold) from a circle, so the same topology always looks the same.
pub fn layout(nodes: &[String], edges: &[(String, String)]) -> Vec<(f64, f64)> {
    const W: f64 = 1000.0;
    const H: f64 = 640.0;
    const MARGIN: f64 = 70.0;
    let n = nodes.len();
    if n == 0 {
        return vec![];
    }
    if n == 1 {
        return vec![(W / 2.0, H / 2.0)];
    }
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let edges: Vec<(usize, usize)> = edges
        .iter()
        .filter_map(|(a, b)| Some((*index.get(a.as_str())?, *index.get(b.as_str())?)))
        .filter(|(a, b)| a != b)
        .collect();
    let mut pos: Vec<(f64, f64)> = (0..n)
        .map(|i| {
            let a = std::f64::consts::TAU * i as f64 / n as f64;
            (W / 2.0 + 300.0 * a.cos(), H / 2.0 + 200.0 * a.sin())
        })
        .collect();
    let k = (W * H / n as f64).sqrt() * 0.6;
    let iterations = 300;
    for it in 0..iterations {
        let temperature = 80.0 * (1.0 - it as f64 / iterations as f64) + 0.5;
        let mut disp = vec![(0.0f64, 0.0f64); n];
        for i in 0..n {
            for j in (i + 1)..n {
                let (dx, dy) = (pos[i].0 - pos[j].0, pos[i].1 - pos[j].1);
                let d = (dx * dx + dy * dy).sqrt().max(0.01);
                let f = k * k / d;
                disp[i].0 += dx / d * f;
                disp[i].1 += dy / d * f;
                disp[j].0 -= dx / d * f;
                disp[j].1 -= dy / d * f;
            }
        }
        for &(a, b) in &edges {
            let (dx, dy) = (pos[a].0 - pos[b].0, pos[a].1 - pos[b].1);
            let d = (dx * dx + dy * dy).sqrt().max(0.01);
            let f = d * d / k;
            disp[a].0 -= dx / d * f;
            disp[a].1 -= dy / d * f;
            disp[b].0 += dx / d * f;
            disp[b].1 += dy / d * f;
        }
        for i in 0..n {
            let (dx, dy) = disp[i];
            let d = (dx * dx + dy * dy).sqrt().max(0.01);
            pos[i].0 += dx / d * d.min(temperature);
            pos[i].1 += dy / d * d.min(temperature);
        }
    }
    // Turn the drawing so its long axis runs across the (wide) box: a line of
    // nodes is drawn left to right, not top to bottom.
    let n_f = n as f64;
    let (mx, my) = pos
        .iter()
        .fold((0.0, 0.0), |(sx, sy), p| (sx + p.0 / n_f, sy + p.1 / n_f));
    let (sxx, syy, sxy) = pos.iter().fold((0.0, 0.0, 0.0), |(a, b, c), p| {
        let (dx, dy) = (p.0 - mx, p.1 - my);
        (a + dx * dx, b + dy * dy, c + dx * dy)
    });
    let angle = 0.5 * (2.0 * sxy).atan2(sxx - syy);
    let (sin, cos) = (-angle).sin_cos();
    for p in &mut pos {
        let (dx, dy) = (p.0 - mx, p.1 - my);
        *p = (dx * cos - dy * sin, dx * sin + dy * cos);
    }
    // Reading order: the first node on the left.
    if pos[0].0 > 0.0 {
        for p in &mut pos {
            p.0 = -p.0;
        }
    }
    // Fit the drawing to the box, keeping its proportions.
    let (min_x, max_x) = pos.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let (min_y, max_y) = pos.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let scale = ((W - 2.0 * MARGIN) / (max_x - min_x).max(1.0))
        .min((H - 2.0 * MARGIN) / (max_y - min_y).max(1.0));
    let (cx, cy) = ((min_x + max_x) / 2.0, (min_y + max_y) / 2.0);
    pos.iter()
        .map(|(x, y)| {
            (
                ((x - cx) * scale + W / 2.0).round(),
                ((y - cy) * scale + H / 2.0).round(),
            )
        })
        .collect()
}

/// A Graphviz string: quoted, with quotes and backslashes escaped.
fn quoted(s: &str) -> String {
    lines(&[s])
}

/// A Graphviz string of several lines (`\n` escapes between them).
fn lines(parts: &[&str]) -> String {
    let escaped: Vec<String> = parts
        .iter()
        .map(|s| {
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', " ")
        })
        .collect();
    format!("\"{}\"", escaped.join("\\n"))
}

/// Mermaid labels cannot contain `"`; names are DNS labels, this is a safeguard.
fn mermaid_text(s: &str) -> String {
    s.replace('"', "#quot;")
}

/// Mermaid node ids must be plain words; ours may contain `-` and `.`.
fn mermaid_id(i: usize) -> String {
    format!("n{i}")
}

fn direction_label(from: &str, to: &str, d: &DirectionLoad) -> String {
    format!("{from}→{to} {}", format::load(d))
}

pub fn mermaid(t: &TopologyLoad) -> String {
    let ids: HashMap<&str, String> = t
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), mermaid_id(i)))
        .collect();
    let mut out = format!(
        "%% topology {} (generation {})\ngraph LR\n",
        t.name, t.generation
    );
    for n in &t.nodes {
        out.push_str(&format!(
            "  {}[\"{}<br/><small>{}</small>\"]\n",
            ids[n.name.as_str()],
            mermaid_text(&n.name),
            mermaid_text(&n.overlay)
        ));
    }
    let mut styles = Vec::new();
    let mut edge = 0;
    for l in &t.links {
        let (Some(a), Some(b)) = (ids.get(l.dialer.as_str()), ids.get(l.acceptor.as_str())) else {
            continue;
        };
        out.push_str(&format!(
            "  {a} -- \"{}<br/>{}<br/>{}\" --- {b}\n",
            mermaid_text(&l.name),
            mermaid_text(&direction_label(&l.dialer, &l.acceptor, &l.forward)),
            mermaid_text(&direction_label(&l.acceptor, &l.dialer, &l.backward)),
        ));
        let busier = busier(&l.forward, &l.backward);
        let dash = if l.up { "" } else { ",stroke-dasharray:4" };
        styles.push(format!(
            "  linkStyle {edge} stroke:{},stroke-width:3px{dash}\n",
            format::colour(busier, l.up)
        ));
        edge += 1;
    }
    for s in styles {
        out.push_str(&s);
    }
    out
}

/// The direction whose colour stands for the whole link in one-line formats.
fn busier<'a>(a: &'a DirectionLoad, b: &'a DirectionLoad) -> &'a DirectionLoad {
    let key = |d: &DirectionLoad| (d.utilisation().unwrap_or(-1.0), d.rate_bps.unwrap_or(-1.0));
    if key(b) > key(a) { b } else { a }
}

pub fn dot(t: &TopologyLoad) -> String {
    let mut out = format!(
        "// topology {} (generation {})\ngraph {} {{\n  layout=neato; overlap=false; splines=true;\n  \
         node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3fb\", fontname=\"Helvetica\"];\n  \
         edge [fontname=\"Helvetica\", fontsize=10, penwidth=3];\n",
        t.name,
        t.generation,
        quoted(&t.name)
    );
    for n in &t.nodes {
        out.push_str(&format!(
            "  {} [label={}];\n",
            quoted(&n.name),
            lines(&[&n.name, &n.overlay])
        ));
    }
    for l in &t.links {
        let label = lines(&[
            &l.name,
            &direction_label(&l.dialer, &l.acceptor, &l.forward),
            &direction_label(&l.acceptor, &l.dialer, &l.backward),
        ]);
        out.push_str(&format!(
            "  {} -- {} [label={}, color={}{}];\n",
            quoted(&l.dialer),
            quoted(&l.acceptor),
            label,
            quoted(format::colour(busier(&l.forward, &l.backward), l.up)),
            if l.up { "" } else { ", style=dashed" }
        ));
    }
    out.push_str("}\n");
    out
}

fn direction_json(d: &DirectionLoad, up: bool) -> serde_json::Value {
    json!({
        "rate_bps": d.rate_bps,
        "configured_bps": d.configured_bps,
        "utilisation": d.utilisation(),
        "drops_per_sec": d.drops_per_sec,
        "queue_packets": d.queue_packets,
        "rtt_us": d.rtt_us,
        "label": format::load(d),
        "colour": format::colour(d, up),
    })
}

/// What the HTML page draws: the graph with positions, colours and labels
/// decided here, so the page's script only draws.
pub fn page_data(
    t: &TopologyLoad,
    live_url: Option<&str>,
    generated_at: &str,
) -> serde_json::Value {
    let names: Vec<String> = t.nodes.iter().map(|n| n.name.clone()).collect();
    let edges: Vec<(String, String)> = t
        .links
        .iter()
        .map(|l| (l.dialer.clone(), l.acceptor.clone()))
        .collect();
    let positions = layout(&names, &edges);
    json!({
        "topology": t.name,
        "generation": t.generation,
        "generated_at": generated_at,
        "live": live_url,
        "nodes": t.nodes.iter().zip(&positions).map(|(n, (x, y))| json!({
            "name": n.name, "overlay": n.overlay, "state": n.agent_state, "x": x, "y": y,
        })).collect::<Vec<_>>(),
        "links": t.links.iter().map(|l| json!({
            "name": l.name, "a": l.dialer, "b": l.acceptor, "up": l.up, "transport": l.transport,
            "forward": direction_json(&l.forward, l.up),
            "backward": direction_json(&l.backward, l.up),
        })).collect::<Vec<_>>(),
    })
}

/// The self-contained page. With `live_url` (served by the hub) it refreshes
/// itself from that URL every second; as a file it shows the moment it was made.
pub fn html(t: &TopologyLoad, live_url: Option<&str>, generated_at: &str) -> String {
    let data = page_data(t, live_url, generated_at).to_string();
    // Inside <script>, "</script>" or "<!--" in a name would end or confuse the
    // block; JSON allows escaping every '<'.
    let data = data.replace('<', "\\u003c");
    PAGE.replace("__NEXTMINI_DATA__", &data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::load::{LinkLoad, NodeInfo};

    fn line3() -> TopologyLoad {
        let node = |n: &str, i: u8| NodeInfo {
            name: n.into(),
            overlay: format!("198.18.0.{i}"),
            agent_state: "connected".into(),
        };
        let link = |a: &str, b: &str, rate: Option<f64>| LinkLoad {
            name: format!("{a}-{b}"),
            dialer: a.into(),
            acceptor: b.into(),
            transport: "tcp".into(),
            up: true,
            forward: DirectionLoad {
                rate_bps: rate,
                configured_bps: Some(10_000_000),
                connected: true,
                ..DirectionLoad::default()
            },
            backward: DirectionLoad {
                connected: true,
                ..DirectionLoad::default()
            },
        };
        TopologyLoad {
            name: "line3".into(),
            generation: 2,
            nodes: vec![node("a", 1), node("b", 2), node("c", 3)],
            links: vec![link("a", "b", Some(9.6e6)), link("b", "c", None)],
        }
    }

    #[test]
    fn layout_is_deterministic_and_inside_the_box() {
        let names: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
        let edges: Vec<(String, String)> = (0..12)
            .map(|i| (names[i].clone(), names[(i + 1) % 12].clone()))
            .collect();
        let a = layout(&names, &edges);
        assert_eq!(a, layout(&names, &edges));
        assert!(
            a.iter()
                .all(|(x, y)| (0.0..=1000.0).contains(x) && (0.0..=640.0).contains(y))
        );
        let distinct: std::collections::HashSet<(i64, i64)> =
            a.iter().map(|(x, y)| (*x as i64, *y as i64)).collect();
        assert_eq!(distinct.len(), 12, "no two nodes on one spot");
    }

    #[test]
    fn mermaid_names_every_node_and_link_with_colour() {
        let m = mermaid(&line3());
        assert!(m.contains("graph LR"));
        assert!(m.contains("n0[\"a<br/><small>198.18.0.1</small>\"]"));
        assert!(m.contains("n0 -- \"a-b<br/>a→b 9.60 Mbit/s (96%)<br/>b→a -\" --- n1"));
        assert!(m.contains("linkStyle 0 stroke:#e53935"));
        assert!(m.contains("linkStyle 1 stroke:#78909c"));
    }

    #[test]
    fn dot_is_an_undirected_graph_with_labels() {
        let d = dot(&line3());
        assert!(d.starts_with("// topology line3"));
        assert!(d.contains("graph \"line3\" {"));
        assert!(d.contains(
            "\"a\" -- \"b\" [label=\"a-b\\na→b 9.60 Mbit/s (96%)\\nb→a -\", color=\"#e53935\"];"
        ));
        assert!(d.contains("\"a\" [label=\"a\\n198.18.0.1\"];"), "{d}");
        assert!(d.trim_end().ends_with('}'));
    }

    #[test]
    fn html_is_self_contained() {
        let mut t = line3();
        t.nodes[0].name = "</script><b>".into();
        let page = html(&t, None, "now");
        assert!(!page.contains("__NEXTMINI_DATA__"));
        assert!(
            !page.contains("</script><b>"),
            "data cannot end the script block"
        );
        for external in ["src=\"http", "href=\"http", "@import", "cdn"] {
            assert!(!page.contains(external), "page loads {external}");
        }
        assert!(page.contains("<svg"));
    }
}
