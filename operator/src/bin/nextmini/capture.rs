//! `nextmini capture LINK`: streams pcapng of one link direction from the agent
//! that sends it, each packet annotated with what the emulated link did to it
//! (enqueue and departure times, queue depth, verdict). The agent does the
//! work; this command finds its socket, asks and copies the stream out.

use crate::local::Local;
use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use pcap_file::pcapng::blocks::interface_statistics::InterfaceStatisticsOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    /// The link to capture.
    link: String,
    /// Which direction: forward is from the link's first endpoint to its second.
    #[arg(short, long, value_enum, default_value_t = Direction::Forward)]
    direction: Direction,
    /// Topology of the link (needed only when several are running).
    #[arg(short, long, env = "NEXTMINI_TOPOLOGY")]
    topology: Option<String>,
    /// Write pcapng here; `-` is standard output (e.g. `-w - | tshark -r -`).
    #[arg(short = 'w', long = "write", default_value = "-")]
    write: String,
    /// Stop after this many packets.
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Stop after this many seconds (e.g. 2.5).
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<Duration>,
    /// Bytes kept of each packet (default: all of it).
    #[arg(short = 's', long)]
    snaplen: Option<u32>,
    /// Capture at this node's agent on this machine, without asking the
    /// database which node sends the direction: what a cluster needs, run in
    /// the node's pod (`kubectl exec POD -- nextmini capture LINK --node NODE
    /// -w - > LINK.pcapng`). The direction is the one NODE sends.
    #[arg(long, conflicts_with = "direction")]
    node: Option<String>,
    /// Ask the agent serving this socket.
    #[arg(long, conflicts_with_all = ["node", "direction"])]
    socket: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Backward,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{s:?} is not a positive number of seconds"))
}

pub async fn capture(local: &Local, args: CaptureArgs) -> anyhow::Result<i32> {
    if args.write == "-" && std::io::stdout().is_terminal() {
        bail!("pcapng is binary: write it to a file (-w FILE) or pipe it (-w - | tshark -r -)");
    }
    if args.snaplen == Some(0) {
        bail!("--snaplen: must be at least 1");
    }
    let (socket, what) = match (&args.socket, &args.node) {
        (Some(s), _) => (s.clone(), format!("link {}", args.link)),
        (None, Some(node)) => {
            let Some(topology) = &args.topology else {
                bail!(
                    "--node needs the topology: -t NAME or NEXTMINI_TOPOLOGY (set in Nextmini's pods)"
                );
            };
            let socket =
                nextmini_operator::observe::sockets::agent_socket(&local.state_dir, topology, node);
            (socket, format!("link {} from {node}", args.link))
        }
        (None, None) => find_sender(local, &args).await?,
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("link", &args.link);
    if let Some(c) = args.count {
        query.append_pair("count", &c.to_string());
    }
    if let Some(d) = args.duration {
        query.append_pair("duration_ms", &d.as_millis().max(1).to_string());
    }
    if let Some(s) = args.snaplen {
        query.append_pair("snaplen", &s.to_string());
    }
    let mut out: Box<dyn Write> = if args.write == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&args.write)
                .with_context(|| format!("creating {}", args.write))?,
        )
    };
    eprintln!("capturing {what} (Ctrl-C stops)");
    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .with_context(|| format!("connecting to the agent at {}", socket.display()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("talking to the agent")?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(format!("/capture?{}", query.finish()))
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        driver.abort();
        bail!(
            "the agent refused ({status}): {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    let mut body = response.into_body();
    let mut tally = Tally::default();
    let mut progress = Progress::new();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = tokio::signal::ctrl_c() => break,
        };
        let Some(frame) = frame else { break };
        let Ok(chunk) = frame?.into_data() else {
            continue;
        };
        out.write_all(&chunk)
            .and_then(|()| out.flush())
            .context("writing the capture")?;
        tally.add(&chunk);
        progress.show(&tally);
    }
    driver.abort();
    progress.clear();
    let missed = match tally.missed {
        Some(m) if m > 0 => format!(", {m} missed: the capture fell behind the link"),
        _ => String::new(),
    };
    eprintln!("{} packets captured{missed}", tally.packets);
    Ok(0)
}

/// The socket of the agent that sends `args.link` in `args.direction`.
async fn find_sender(local: &Local, args: &CaptureArgs) -> anyhow::Result<(PathBuf, String)> {
    let store = crate::tools::running_store(local).await?;
    let topology = crate::tools::pick_topology(&store, args.topology.clone()).await?;
    let Some((dialer, acceptor)) =
        nextmini_operator::observe::load::link_endpoints(&store, &topology, &args.link).await?
    else {
        bail!("topology {topology} has no link named {}", args.link);
    };
    let (from, to) = match args.direction {
        Direction::Forward => (dialer, acceptor),
        Direction::Backward => (acceptor, dialer),
    };
    let socket =
        nextmini_operator::observe::sockets::agent_socket(&local.state_dir, &topology, &from);
    Ok((socket, format!("link {} from {from} to {to}", args.link)))
}

/// Packets seen in the stream so far, and the capture's own count of the
/// ones it missed (from the closing statistics block).
#[derive(Default)]
struct Tally {
    pending: Vec<u8>,
    parser: Option<PcapNgParser>,
    packets: u64,
    missed: Option<u64>,
}

impl Tally {
    fn add(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
        let mut rest: &[u8] = &self.pending;
        if self.parser.is_none() {
            match PcapNgParser::new(rest) {
                Ok((r, p)) => {
                    self.parser = Some(p);
                    rest = r;
                }
                Err(_) => return,
            }
        }
        let Some(parser) = self.parser.as_mut() else {
            return;
        };
        while let Ok((r, block)) = parser.next_block(rest) {
            match block {
                Block::EnhancedPacket(_) => self.packets += 1,
                Block::InterfaceStatistics(s) => {
                    self.missed = s.options.iter().find_map(|o| match o {
                        InterfaceStatisticsOption::IsbIfDrop(n) => Some(*n),
                        _ => None,
                    })
                }
                _ => {}
            }
            rest = r;
        }
        let used = self.pending.len() - rest.len();
        self.pending.drain(..used);
    }
}

/// A packet count on standard error, refreshed at most every 200 ms, when it
/// is a terminal.
struct Progress {
    tty: bool,
    last: Instant,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
        }
    }

    fn show(&mut self, tally: &Tally) {
        if self.tty && self.last.elapsed() >= Duration::from_millis(200) {
            self.last = Instant::now();
            eprint!("\r{} packets", tally.packets);
        }
    }

    fn clear(&self) {
        if self.tty {
            eprint!("\r\x1b[K");
        }
    }
}
