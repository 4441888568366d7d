//! A UDP sink inside a node that records every datagram: when it arrived
//! (CLOCK_MONOTONIC, ns, or the wall clock to compare with stored times) and the sequence number a sender wrote as its first 8
//! ASCII digits, if any. The trace-link and seed suites read their results
//! from it.

use crate::Env;
use std::path::PathBuf;
use std::time::Duration;

/// Records until `argv[3]` seconds pass without a datagram after the first,
/// then writes `<ns> <seq or -1>` lines to argv[1] (renamed into place whole).
const SINK: &str = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", int(sys.argv[2])))
clock = time.time_ns if sys.argv[4:] == ["wall"] else time.monotonic_ns
lines = []
while True:
    try:
        data = s.recv(65536)
    except socket.timeout:
        break
    seq = int(data[:8]) if data[:8].isdigit() else -1
    lines.append("%d %d" % (clock(), seq))
    s.settimeout(float(sys.argv[3]))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("\n".join(lines))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"#;

/// One datagram as the sink saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at_ns: u64,
    pub seq: Option<u32>,
}

/// A running sink; [`UdpSink::arrivals`] waits for its record.
pub struct UdpSink {
    file: PathBuf,
}

impl UdpSink {
    /// Starts the sink on `port` in `node` and waits until it listens. It
    /// stops `idle` after the last datagram (or with the environment).
    pub fn start(env: &mut Env, node: &str, port: u16, idle: Duration) -> UdpSink {
        Self::start_on_clock(env, node, port, idle, false)
    }

    /// As [`UdpSink::start`], with arrival times on the wall clock (ns since
    /// the Unix epoch), to compare with times stored in PostgreSQL.
    pub fn start_wall_clock(env: &mut Env, node: &str, port: u16, idle: Duration) -> UdpSink {
        Self::start_on_clock(env, node, port, idle, true)
    }

    fn start_on_clock(env: &mut Env, node: &str, port: u16, idle: Duration, wall: bool) -> UdpSink {
        let file = env.state_dir.join(format!("udp-sink-{node}-{port}"));
        let _ = std::fs::remove_file(&file);
        let out = file.to_str().expect("state dir is UTF-8").to_owned();
        let (port_arg, idle_arg) = (port.to_string(), idle.as_secs_f64().to_string());
        let clock = if wall { "wall" } else { "monotonic" };
        env.spawn_in(
            node,
            &["python3", "-c", SINK, &out, &port_arg, &idle_arg, clock],
        );
        let listening = format!("ss -lun | grep -q ':{port} '");
        env.wait_for("the UDP sink", Duration::from_secs(10), || {
            env.exec(node, &["sh", "-c", &listening]).status.success()
        });
        UdpSink { file }
    }

    /// Waits up to `limit` for the sink to stop and returns what it saw, in
    /// arrival order.
    pub fn arrivals(self, env: &Env, limit: Duration) -> Vec<Arrival> {
        env.wait_for("the UDP sink's record", limit, || self.file.exists());
        let text = std::fs::read_to_string(&self.file).expect("the sink's record");
        let _ = std::fs::remove_file(&self.file);
        text.lines()
            .filter_map(|line| {
                let (at, seq) = line.split_once(' ')?;
                Some(Arrival {
                    at_ns: at.parse().ok()?,
                    seq: seq.parse().ok(),
                })
            })
            .collect()
    }
}
