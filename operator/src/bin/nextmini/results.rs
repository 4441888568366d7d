//! `nextmini results`: what synthetic flows achieved. A table per flow (the
//! Flow's status: instances done and failed, p50/p99 completion time), every
//! instance as CSV, and a PNG of completion time against size and of the
//! flows' throughput over time.

use crate::local::Local;
use anyhow::{Context, bail};
use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use nextmini_operator::api::FlowStatus;
use nextmini_operator::store::{FlowResultRow, FlowRow, flow_status};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    /// Topology whose flows to show (default: all).
    topology: Option<String>,
    /// Only this flow.
    #[arg(long)]
    flow: Option<String>,
    /// Also write every instance to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Draw completion time against size, and throughput over time, into this PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Output format of the summary.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    /// Write the run's record to FILE instead: the topology's manifest as
    /// applied, with its seed and the timeline of its scenario events, which
    /// `nextmini up -f FILE` brings up again.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["flow", "csv", "plot"])]
    record: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Format {
    Table,
    Json,
}

/// One flow's line: its definition (if it still has one) and its results.
struct Summary<'a> {
    topology: &'a str,
    flow: &'a str,
    route: String,
    status: FlowStatus,
    rows: Vec<&'a FlowResultRow>,
}

pub async fn results(local: &Local, args: ResultsArgs) -> anyhow::Result<i32> {
    let Some(store) = local.existing_store().await? else {
        bail!("nothing is running (the private PostgreSQL is stopped): no results to show");
    };
    if let Some(file) = &args.record {
        let topology = crate::tools::pick_topology(&store, args.topology.clone()).await?;
        crate::record::write(&store, &topology, file).await?;
        println!(
            "wrote the record of topology {topology} to {}",
            file.display()
        );
        return Ok(0);
    }
    let topology = args.topology.as_deref();
    if let Some(t) = topology
        && store.generation(t).await?.is_none()
    {
        bail!("no topology named {t}");
    }
    let flows: Vec<FlowRow> = store
        .flows(topology)
        .await?
        .into_iter()
        .filter(|f| args.flow.as_ref().is_none_or(|n| *n == f.name))
        .collect();
    let rows = store.flow_results(topology, args.flow.as_deref()).await?;
    if flows.is_empty() && rows.is_empty() {
        match &args.flow {
            Some(f) => bail!("no flow named {f}"),
            None => println!("no flows"),
        }
        return Ok(0);
    }
    let summaries = summarize(&flows, &rows);
    match args.output {
        Format::Table => print_table(&summaries),
        Format::Json => {
            let doc: Vec<serde_json::Value> = summaries
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "topology": s.topology,
                        "flow": s.flow,
                        "route": s.route,
                        "status": s.status,
                        "bytes": s.rows.iter().map(|r| r.bytes).sum::<i64>(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    if let Some(path) = &args.csv {
        write_csv(path, &rows).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} instances to {}", rows.len(), path.display());
    }
    if let Some(path) = &args.plot {
        plot::draw(path, &summaries).with_context(|| format!("drawing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(0)
}

fn summarize<'a>(flows: &'a [FlowRow], rows: &'a [FlowResultRow]) -> Vec<Summary<'a>> {
    let mut by_flow: BTreeMap<(&str, &str), Vec<&FlowResultRow>> = BTreeMap::new();
    for r in rows {
        by_flow
            .entry((r.topology.as_str(), r.flow.as_str()))
            .or_default()
            .push(r);
    }
    let mut out: Vec<Summary> = flows
        .iter()
        .map(|f| {
            let rows = by_flow
                .remove(&(f.topology.as_str(), f.name.as_str()))
                .unwrap_or_default();
            Summary {
                topology: &f.topology,
                flow: &f.name,
                route: format!("{} → {}", f.src, f.dst),
                status: flow_status(f.count, &rows),
                rows,
            }
        })
        .collect();
    // Results of flows no longer defined stay until their topology goes.
    for ((topology, flow), rows) in by_flow {
        let route = rows
            .first()
            .map(|r| format!("{} → {} (removed)", r.src, r.dst))
            .unwrap_or_default();
        out.push(Summary {
            topology,
            flow,
            route,
            status: flow_status(rows.len() as u32, &rows),
            rows,
        });
    }
    out.sort_by(|a, b| (a.topology, a.flow).cmp(&(b.topology, b.flow)));
    out
}

fn print_table(summaries: &[Summary]) {
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY).set_header([
        "TOPOLOGY",
        "FLOW",
        "ROUTE",
        "PHASE",
        "DONE",
        "FAILED",
        "TOTAL",
        "BYTES",
        "P50 FCT",
        "P99 FCT",
        "MEAN TPUT",
        "RETX",
        "UNFAITHFUL",
    ]);
    for s in summaries {
        let done: Vec<&&FlowResultRow> = s.rows.iter().filter(|r| r.fct_us.is_some()).collect();
        let bytes: i64 = s.rows.iter().map(|r| r.bytes).sum();
        let mean_tput = if done.is_empty() {
            "-".to_owned()
        } else {
            let sum: f64 = done.iter().filter_map(|r| r.throughput_bps).sum();
            rate(sum / done.len() as f64)
        };
        let retx: i64 = s.rows.iter().filter_map(|r| r.retransmissions).sum();
        let fct = |d: &Option<nextmini_operator::units::Duration>| {
            d.map_or("-".to_owned(), |d| {
                format!("{:.3} ms", d.as_std().as_secs_f64() * 1e3)
            })
        };
        table.add_row([
            s.topology.to_owned(),
            s.flow.to_owned(),
            s.route.clone(),
            s.status
                .phase
                .map_or("Pending".to_owned(), |p| format!("{p:?}")),
            s.status.completed.to_string(),
            s.status.failed.to_string(),
            s.status.total.to_string(),
            bytes_text(bytes),
            fct(&s.status.fct_p50),
            fct(&s.status.fct_p99),
            mean_tput,
            retx.to_string(),
            s.status.unfaithful.to_string(),
        ]);
    }
    println!("{table}");
    let unfaithful: u32 = summaries.iter().map(|s| s.status.unfaithful).sum();
    if unfaithful > 0 {
        println!(
            "{unfaithful} instance(s) ran while the emulator, not the emulated links, limited traffic: \
             their figures may measure the emulator (`nextmini status` names the links and why)"
        );
    }
}

fn rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.2} Mbit/s", bps / 1e6)
    } else {
        format!("{:.1} kbit/s", bps / 1e3)
    }
}

fn bytes_text(b: i64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

const CSV_HEADER: &str = "topology,flow,instance,src,dst,protocol,size_bytes,bytes,received_bytes,started_unix_us,finished_unix_us,fct_us,throughput_bps,retransmissions,error,unfaithful";

fn write_csv(path: &Path, rows: &[FlowResultRow]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{CSV_HEADER}")?;
    for r in rows {
        writeln!(out, "{}", csv_line(r))?;
    }
    out.flush()?;
    Ok(())
}

fn csv_line(r: &FlowResultRow) -> String {
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    [
        csv_field(&r.topology),
        csv_field(&r.flow),
        r.instance.to_string(),
        csv_field(&r.src),
        csv_field(&r.dst),
        r.protocol.clone(),
        opt(r.size_bytes),
        r.bytes.to_string(),
        opt(r.received_bytes),
        r.started_at.timestamp_micros().to_string(),
        opt(r.finished_at.map(|t| t.timestamp_micros())),
        opt(r.fct_us),
        r.throughput_bps
            .map(|t| format!("{t:.0}"))
            .unwrap_or_default(),
        opt(r.retransmissions),
        csv_field(r.error.as_deref().unwrap_or("")),
        r.unfaithful.to_string(),
    ]
    .join(",")
}

/// Quotes a field when it holds a separator, a quote or a line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

mod plot {
    //! The PNG: completion time against size (log-log, one colour per flow),
    //! and each flow's throughput over time.
    use super::Summary;
    use anyhow::{Context, anyhow, bail};
    use plotters::prelude::*;
    use std::path::Path;
    use std::sync::Once;

    /// Where Debian and most distributions keep a sans-serif TrueType font;
    /// `scripts/setup.sh` installs fonts-dejavu-core.
    const FONTS: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    ];

    fn register_font() -> anyhow::Result<()> {
        static ONCE: Once = Once::new();
        let mut result = Ok(());
        ONCE.call_once(|| {
            result = (|| {
                let path = std::env::var("NEXTMINI_FONT")
                    .ok()
                    .into_iter()
                    .chain(FONTS.iter().map(|s| s.to_string()))
                    .find(|p| Path::new(p).exists())
                    .ok_or_else(|| {
                        anyhow!(
                            "no TrueType font for the labels: install fonts-dejavu-core, or set NEXTMINI_FONT to a .ttf file"
                        )
                    })?;
                let bytes = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
                // plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| anyhow!("{path} is not a TrueType font plotters can read"))
            })();
        });
        result
    }

    /// Aggregate payload throughput per time bin, each instance's bytes spread
    /// evenly over its lifetime. Times in seconds since `origin_us`.
    pub(super) fn throughput_series(
        spans: &[(i64, i64, i64)],
        origin_us: i64,
        bin_us: i64,
    ) -> Vec<(f64, f64)> {
        let Some(end) = spans.iter().map(|s| s.1).max() else {
            return Vec::new();
        };
        let bins = ((end - origin_us) / bin_us + 1).clamp(1, 100_000) as usize;
        let mut bytes = vec![0.0f64; bins];
        for &(start, finish, b) in spans {
            let len = (finish - start).max(1) as f64;
            let mut t = start;
            while t < finish {
                let i = ((t - origin_us) / bin_us).clamp(0, bins as i64 - 1) as usize;
                let bin_end = origin_us + (i as i64 + 1) * bin_us;
                let upto = finish.min(bin_end).max(t + 1);
                bytes[i] += b as f64 * (upto - t) as f64 / len;
                t = upto;
            }
        }
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| {
                (
                    (i as f64 + 0.5) * bin_us as f64 / 1e6,
                    b * 8.0 / (bin_us as f64 / 1e6),
                )
            })
            .collect()
    }

    /// A flow's throughput line: its colour index, name and points.
    type Series<'a> = (usize, &'a str, Vec<(f64, f64)>);

    pub(super) fn draw(path: &Path, summaries: &[Summary]) -> anyhow::Result<()> {
        register_font()?;
        let done: Vec<(usize, &Summary)> = summaries
            .iter()
            .enumerate()
            .filter(|(_, s)| s.rows.iter().any(|r| r.fct_us.is_some()))
            .collect();
        if done.is_empty() {
            bail!("no completed instance to plot yet");
        }
        let root = BitMapBackend::new(path, (1600, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(800);

        let points: Vec<(usize, f64, f64)> = done
            .iter()
            .flat_map(|(i, s)| {
                s.rows.iter().filter_map(move |r| {
                    let fct = r.fct_us? as f64 / 1e3;
                    let size = r.size_bytes.unwrap_or(r.bytes).max(1) as f64;
                    Some((*i, size, fct.max(1e-3)))
                })
            })
            .collect();
        let (min_x, max_x) = bounds(points.iter().map(|p| p.1));
        let (min_y, max_y) = bounds(points.iter().map(|p| p.2));
        let mut chart = ChartBuilder::on(&left)
            .caption("Flow completion time against size", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (min_x / 1.5..max_x * 1.5).log_scale(),
                (min_y / 1.5..max_y * 1.5).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("size")
            .y_desc("FCT (ms)")
            .x_label_formatter(&|b| super::bytes_text(b.round() as i64))
            .y_label_formatter(&|ms| {
                format!("{ms:.3}")
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_owned()
            })
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, s) in &done {
            let color = Palette99::pick(*i).to_rgba();
            chart
                .draw_series(
                    points
                        .iter()
                        .filter(|p| p.0 == *i)
                        .map(|p| Circle::new((p.1, p.2), 3, color.filled())),
                )?
                .label(s.flow)
                .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;

        let spans = |s: &Summary| -> Vec<(i64, i64, i64)> {
            s.rows
                .iter()
                .filter_map(|r| {
                    let finish = r.finished_at?.timestamp_micros();
                    Some((r.started_at.timestamp_micros(), finish, r.bytes))
                })
                .collect()
        };
        let all: Vec<(i64, i64, i64)> = done.iter().flat_map(|(_, s)| spans(s)).collect();
        let origin = all.iter().map(|s| s.0).min().unwrap_or(0);
        let end = all.iter().map(|s| s.1).max().unwrap_or(origin + 1);
        // About 200 bins over the run, never finer than 10 ms.
        let bin = ((end - origin) / 200).max(10_000);
        let series: Vec<Series> = done
            .iter()
            .map(|(i, s)| (*i, s.flow, throughput_series(&spans(s), origin, bin)))
            .collect();
        let max_t = (end - origin) as f64 / 1e6;
        let max_rate = series
            .iter()
            .flat_map(|(_, _, v)| v.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            / 1e6;
        let mut chart = ChartBuilder::on(&right)
            .caption("Throughput over time", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..max_t.max(1e-3) * 1.02, 0.0..max_rate.max(1e-3) * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("time since the first start (s)")
            .y_desc("throughput (Mbit/s, payload)")
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, flow, points) in &series {
            let color = Palette99::pick(*i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| (p.0, p.1 / 1e6)),
                    color.stroke_width(2),
                ))?
                .label(*flow)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
        root.present()?;
        Ok(())
    }

    fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if lo > hi {
            (1.0, 10.0)
        } else {
            (lo, hi.max(lo * 1.01))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_is_spread_over_each_instances_lifetime() {
        // 1 MB over the first second, 1 MB over the second half of it.
        let series = plot::throughput_series(
            &[(0, 1_000_000, 1_000_000), (500_000, 1_000_000, 1_000_000)],
            0,
            250_000,
        );
        let mbit: Vec<f64> = series.iter().map(|p| (p.1 / 1e6).round()).collect();
        assert_eq!(mbit[..4], [8.0, 8.0, 24.0, 24.0]);
        let total: f64 = series.iter().map(|p| p.1 * 0.25 / 8.0).sum();
        assert!(
            (total - 2e6).abs() < 1.0,
            "every byte lands in a bin: {total}"
        );
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, \"b\""), "\"a, \"\"b\"\"\"");
        let row = FlowResultRow {
            topology: "t".into(),
            flow: "f".into(),
            instance: 3,
            src: "a".into(),
            dst: "c".into(),
            protocol: "tcp".into(),
            size_bytes: Some(1000),
            bytes: 1000,
            received_bytes: None,
            started_at: chrono::DateTime::from_timestamp_micros(5).unwrap_or_default(),
            finished_at: chrono::DateTime::from_timestamp_micros(25),
            fct_us: Some(20),
            throughput_bps: Some(4e8),
            retransmissions: Some(0),
            error: None,
            unfaithful: false,
        };
        assert_eq!(
            csv_line(&row),
            "t,f,3,a,c,tcp,1000,1000,,5,25,20,400000000,0,,false"
        );
        assert_eq!(
            csv_line(&row).split(',').count(),
            CSV_HEADER.split(',').count()
        );
    }
}
