//! The fidelity guard: after every report window, each direction of each link
//! this agent sends on is judged faithful or not. Only the agent can see when
//! it, rather than the emulated network, limited the traffic: packets that
//! left its pipeline later than the emulated link released them, packets it
//! dropped before the link's configured queue because its link task fell
//! behind, and the CPU its threads waited for or were denied by a CPU limit.
//! The verdict travels in the report (`LinkCounters.unfaithful`); the hub keeps
//! episodes of it and the Topology shows them (DESIGN.md, "Fidelity guard").

use crate::sched::LATE_BOUND_NS;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::time::Instant;

/// Late packets below this count in one window are noise (one slow wake-up),
/// not a limit on the traffic.
const MIN_LATE_PACKETS: u64 = 10;
/// ... and so is a late share below this, in percent of the packets sent: one
/// stall of a few milliseconds in a second (a page fault burst, a database
/// write beside the agent) delays 1-2% of a 100 Mbit/s link's packets, which
/// is not the emulator limiting the traffic; an agent short of CPU makes a
/// third or more late (BENCHMARKS.md, "The fidelity guard").
const MIN_LATE_PERCENT: u64 = 5;
/// ... and so is being behind the emulated schedule for less than this share
/// of the window: a flow's last packets in a window can be few, and one 4 ms
/// stall then catches most of them (132 of 188 at 500 Mbit/s, seen in the
/// link fidelity test), while an agent short of CPU is behind for most of it.
const MIN_BEHIND_PERCENT: u64 = 5;
/// A window past the thresholds above but under this share late, or under it
/// behind, is marginal: it counts only when the window before it on the same link was
/// unfaithful too. One busy second on a shared 2-core machine (iperf3, both
/// agents, the hub and PostgreSQL at once) made 37 of 663 ACKs (5%) late for
/// 0.05 s of a 1 s window in CI, while the flow got its full rate; an agent
/// short of CPU is late for a third or more of every window (BENCHMARKS.md,
/// "The fidelity guard"), so it is named from its first window.
const CLEAR_PERCENT: u64 = 20;

/// What one direction of one link did in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    pub sent: u64,
    pub late: u64,
    pub max_late_ns: u64,
    /// Time the link ran behind its emulated schedule in the window.
    pub behind_ns: u64,
    /// Packets dropped before the pipeline: the hand-off queue was full.
    pub handoff_drops: u64,
}

/// What the agent's threads went through in the same window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuWindow {
    pub wall_ns: u64,
    /// Time runnable but waiting for a CPU, summed over threads.
    pub waited_ns: u64,
    /// Time the agent's cgroup was stopped by its CPU limit.
    pub throttled_ns: u64,
}

/// How sure one window's verdict is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Faithful,
    /// Unfaithful only if the window before was not faithful either.
    Marginal(String),
    Unfaithful(String),
}

impl Verdict {
    fn reason(self, window_before_faithful: bool) -> Option<String> {
        match self {
            Verdict::Faithful => None,
            Verdict::Marginal(_) if window_before_faithful => None,
            Verdict::Marginal(why) | Verdict::Unfaithful(why) => Some(why),
        }
    }
}

/// One window judged on its own; `Guard` weighs a marginal one against the
/// window before it.
pub fn judge(w: &Window, cpu: &CpuWindow) -> Verdict {
    let mut causes = Vec::new();
    let late_share = w.late * 100 / w.sent.max(1);
    let behind_share = w.behind_ns * 100 / cpu.wall_ns.max(1);
    let late = w.late >= MIN_LATE_PACKETS
        && late_share >= MIN_LATE_PERCENT
        && behind_share >= MIN_BEHIND_PERCENT;
    let clear = w.handoff_drops > 0
        || (late && late_share >= CLEAR_PERCENT && behind_share >= CLEAR_PERCENT);
    if late {
        causes.push(format!(
            "{} of {} packets ({late_share}%) left more than {} ms after the link released them (worst {:.1} ms; behind schedule {:.2} s of {:.1} s)",
            w.late,
            w.sent,
            LATE_BOUND_NS / 1_000_000,
            w.max_late_ns as f64 / 1e6,
            w.behind_ns as f64 / 1e9,
            cpu.wall_ns as f64 / 1e9
        ));
    }
    if w.handoff_drops > 0 {
        causes.push(format!(
            "{} packets dropped before the link's queue (its task fell behind)",
            w.handoff_drops
        ));
    }
    if causes.is_empty() {
        return Verdict::Faithful;
    }
    if let Some(why) = cpu.explain() {
        causes.push(why);
    }
    let why = causes.join("; ");
    if clear {
        Verdict::Unfaithful(why)
    } else {
        Verdict::Marginal(why)
    }
}

impl CpuWindow {
    /// Seconds, not percentages: both figures are sums over threads or CPUs
    /// and can exceed the window.
    fn explain(&self) -> Option<String> {
        const NOTICEABLE_NS: u64 = 1_000_000;
        let secs = |ns: u64| ns as f64 / 1e9;
        let mut parts = Vec::new();
        if self.waited_ns >= NOTICEABLE_NS {
            parts.push(format!(
                "its threads waited {:.2} s for a CPU",
                secs(self.waited_ns)
            ));
        }
        if self.throttled_ns >= NOTICEABLE_NS {
            parts.push(format!(
                "its CPU limit stopped it for {:.2} s",
                secs(self.throttled_ns)
            ));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "the agent had too little CPU: in {:.1} s {}",
                secs(self.wall_ns),
                parts.join(" and ")
            )
        })
    }
}

/// Cumulative figures of one link at the previous report.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    sent: u64,
    late: u64,
    behind_us: u64,
    drops: u64,
    /// The window that ended here was not faithful (marginal ones included).
    unfaithful: bool,
}

/// Judges every report's links against the previous report.
#[derive(Debug)]
pub struct Guard {
    seen: HashMap<String, Seen>,
    cpu: CpuClock,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            seen: HashMap::new(),
            cpu: CpuClock::now(),
        }
    }
}

impl Guard {
    /// Fills `unfaithful` of every link in `links` (the counters just read, with
    /// `max_late_us` covering the window).
    pub fn judge_report(&mut self, links: &mut [pb::LinkCounters]) {
        // An idle agent judges nothing and reads no /proc file: at thousands of
        // agents on a machine, those reads were a good part of their idle CPU.
        let active = links.iter().any(|l| {
            let before = self.seen.get(&l.link).copied().unwrap_or_default();
            l.tx_packets != before.sent
                || l.late_packets != before.late
                || l.behind_us != before.behind_us
                || l.drops.saturating_sub(l.drops_down) != before.drops
        });
        if !active {
            // Nothing ran, so nothing waited for a CPU: the wait and throttle
            // baselines stay valid; only the wall clock starts again.
            self.cpu.at = Instant::now();
            for l in links.iter_mut() {
                l.unfaithful.clear();
            }
            // An idle window between two marginal ones breaks the run.
            for seen in self.seen.values_mut() {
                seen.unfaithful = false;
            }
            return;
        }
        let cpu = self.cpu.window();
        let mut seen = HashMap::with_capacity(links.len());
        for l in links.iter_mut() {
            let before = self.seen.get(&l.link).copied().unwrap_or_default();
            let mut now = Seen {
                sent: l.tx_packets,
                late: l.late_packets,
                behind_us: l.behind_us,
                // A link a scenario took down drops by design, not for want
                // of CPU.
                drops: l.drops.saturating_sub(l.drops_down),
                unfaithful: false,
            };
            // Counters start again when a link is recreated.
            let window = Window {
                sent: now.sent.saturating_sub(before.sent),
                late: now.late.saturating_sub(before.late),
                max_late_ns: l.max_late_us * 1000,
                behind_ns: now.behind_us.saturating_sub(before.behind_us) * 1000,
                handoff_drops: now.drops.saturating_sub(before.drops),
            };
            let verdict = judge(&window, &cpu);
            now.unfaithful = verdict != Verdict::Faithful;
            l.unfaithful = verdict.reason(!before.unfaithful).unwrap_or_default();
            seen.insert(l.link.clone(), now);
        }
        self.seen = seen;
    }
}

/// Reads the process's CPU wait and throttling between calls.
#[derive(Debug)]
struct CpuClock {
    at: Instant,
    waited_ns: u64,
    throttled_ns: u64,
}

impl CpuClock {
    fn now() -> CpuClock {
        CpuClock {
            at: Instant::now(),
            waited_ns: waited_ns(),
            throttled_ns: throttled_ns(),
        }
    }

    fn window(&mut self) -> CpuWindow {
        let next = CpuClock::now();
        let window = CpuWindow {
            wall_ns: next.at.duration_since(self.at).as_nanos() as u64,
            waited_ns: next.waited_ns.saturating_sub(self.waited_ns),
            throttled_ns: next.throttled_ns.saturating_sub(self.throttled_ns),
        };
        *self = next;
        window
    }
}

/// Time this process's threads spent runnable on a run queue, waiting for a
/// CPU (the second field of each thread's schedstat). 0 where unavailable.
fn waited_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Time the process's cgroup was throttled by its CPU limit (cgroup v1
/// `throttled_time` in ns, v2 `throttled_usec`). 0 where unavailable.
fn throttled_ns() -> u64 {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|cgroups| {
            cpu_stat_paths(&cgroups)
                .into_iter()
                .find_map(read_throttled)
        })
        .unwrap_or(0)
}

/// Where the process's `cpu.stat` may be, most specific first.
fn cpu_stat_paths(proc_cgroup: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_end_matches('/');
        if controllers.split(',').any(|c| c == "cpu") {
            paths.push(format!("/sys/fs/cgroup/{controllers}{path}/cpu.stat"));
            paths.push(format!("/sys/fs/cgroup/cpu{path}/cpu.stat"));
        } else if controllers.is_empty() {
            paths.push(format!("/sys/fs/cgroup{path}/cpu.stat"));
            paths.push(format!("/sys/fs/cgroup/unified{path}/cpu.stat"));
        }
    }
    // In a container the cgroup's own directory is mounted at the root.
    paths.push("/sys/fs/cgroup/cpu,cpuacct/cpu.stat".into());
    paths.push("/sys/fs/cgroup/cpu/cpu.stat".into());
    paths.push("/sys/fs/cgroup/cpu.stat".into());
    paths
}

fn read_throttled(path: String) -> Option<u64> {
    parse_throttled(&std::fs::read_to_string(path).ok()?)
}

fn parse_throttled(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        let value: u64 = value.trim().parse().ok()?;
        match key {
            "throttled_time" => Some(value),
            "throttled_usec" => Some(value * 1000),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALM: CpuWindow = CpuWindow {
        wall_ns: 1_000_000_000,
        waited_ns: 0,
        throttled_ns: 0,
    };

    #[test]
    fn a_link_on_time_is_faithful() {
        let w = Window {
            sent: 17_000,
            late: 5,
            max_late_ns: 3_000_000,
            behind_ns: 3_000_000,
            handoff_drops: 0,
        };
        assert_eq!(
            judge(&w, &CALM),
            Verdict::Faithful,
            "a few late packets are noise"
        );
        // One 4 ms stall in a second at 100 Mbit/s (seen on a quiet CI machine).
        let w = Window {
            sent: 2_405,
            late: 45,
            max_late_ns: 4_100_000,
            behind_ns: 4_100_000,
            handoff_drops: 0,
        };
        assert_eq!(
            judge(&w, &CALM),
            Verdict::Faithful,
            "under 5% late is noise"
        );
        // The same stall at the end of a flow, where the window held few
        // packets: most of them late, but the link was behind for 4 ms.
        let w = Window {
            sent: 188,
            late: 132,
            max_late_ns: 4_000_000,
            behind_ns: 4_000_000,
            handoff_drops: 0,
        };
        assert_eq!(judge(&w, &CALM), Verdict::Faithful, "one stall is noise");
    }

    #[test]
    fn late_departures_and_handoff_drops_are_named_with_the_cpu_that_explains_them() {
        let starved = CpuWindow {
            wall_ns: 1_000_000_000,
            waited_ns: 120_000_000,
            throttled_ns: 640_000_000,
        };
        let w = Window {
            sent: 2_000,
            late: 900,
            max_late_ns: 38_200_000,
            behind_ns: 610_000_000,
            handoff_drops: 112,
        };
        let Verdict::Unfaithful(why) = judge(&w, &starved) else {
            panic!("a starved window is named at once");
        };
        assert!(
            why.contains("900 of 2000 packets (45%) left more than 1 ms"),
            "{why}"
        );
        assert!(
            why.contains("worst 38.2 ms; behind schedule 0.61 s of 1.0 s"),
            "{why}"
        );
        assert!(
            why.contains("112 packets dropped before the link's queue"),
            "{why}"
        );
        assert!(
            why.contains("in 1.0 s its threads waited 0.12 s for a CPU and its CPU limit stopped it for 0.64 s"),
            "{why}"
        );
        let only_drops = Window {
            handoff_drops: 1,
            ..Window::default()
        };
        assert!(matches!(judge(&only_drops, &CALM), Verdict::Unfaithful(_)));
    }

    #[test]
    fn a_marginal_window_counts_only_after_another() {
        // CI, agents fed: one busy second made 37 of 663 ACKs late, behind
        // for 0.05 s, while the flow got its full rate.
        let busy = CpuWindow {
            waited_ns: 110_000_000,
            ..CALM
        };
        let w = Window {
            sent: 663,
            late: 37,
            max_late_ns: 6_200_000,
            behind_ns: 50_000_000,
            handoff_drops: 0,
        };
        assert!(matches!(judge(&w, &busy), Verdict::Marginal(_)));

        let mut guard = Guard::default();
        let link = |n: u64| pb::LinkCounters {
            link: "b-a".into(),
            tx_packets: 663 * n,
            late_packets: 37 * n,
            behind_us: 50_000 * n,
            max_late_us: 6_200,
            ..Default::default()
        };
        let mut first = [link(1)];
        guard.judge_report(&mut first);
        assert!(first[0].unfaithful.is_empty(), "{}", first[0].unfaithful);
        let mut second = [link(2)];
        guard.judge_report(&mut second);
        assert!(
            second[0].unfaithful.contains("37 of 663 packets"),
            "two marginal windows in a row are a limit: {}",
            second[0].unfaithful
        );
        // An idle window breaks the run.
        let mut idle = [link(2)];
        guard.judge_report(&mut idle);
        let mut after_idle = [link(3)];
        guard.judge_report(&mut after_idle);
        assert!(after_idle[0].unfaithful.is_empty());
    }

    #[test]
    fn drops_of_a_link_a_scenario_took_down_are_not_the_emulators() {
        let mut guard = Guard::default();
        let link = |drops, drops_down| pb::LinkCounters {
            link: "a-b".into(),
            tx_packets: 1_000,
            drops,
            drops_down,
            ..Default::default()
        };
        let mut down = [link(500, 500)];
        guard.judge_report(&mut down);
        assert!(down[0].unfaithful.is_empty(), "{}", down[0].unfaithful);
        // Hand-off drops beside them still count.
        let mut more = [link(1_100, 1_000)];
        guard.judge_report(&mut more);
        assert!(!more[0].unfaithful.is_empty());
    }

    #[test]
    fn the_guard_judges_each_window_on_its_own() {
        let mut guard = Guard::default();
        // Behind for 1,000 s: longer than any window this test's clock sees.
        let link = |tx_packets, late_packets, drops| pb::LinkCounters {
            link: "a-b".into(),
            tx_packets,
            late_packets,
            behind_us: late_packets * 2_000_000,
            drops,
            max_late_us: 5_000,
            ..Default::default()
        };
        let mut first = [link(1_000, 500, 0)];
        guard.judge_report(&mut first);
        assert!(!first[0].unfaithful.is_empty());
        // The same cumulative late count: nothing new was late.
        let mut second = [link(2_000, 500, 0)];
        guard.judge_report(&mut second);
        assert!(second[0].unfaithful.is_empty());
        // A recreated link starts its counters again.
        let mut third = [link(10, 0, 3)];
        guard.judge_report(&mut third);
        assert!(
            third[0].unfaithful.contains("3 packets dropped"),
            "{}",
            third[0].unfaithful
        );
    }

    #[test]
    fn cgroup_cpu_stat_is_found_in_v1_and_v2() {
        let v1 = cpu_stat_paths("4:memory:/x\n1:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n");
        assert_eq!(
            v1[0],
            "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1/cpu.stat"
        );
        let v2 = cpu_stat_paths("0::/kubepods.slice/pod2\n");
        assert_eq!(v2[0], "/sys/fs/cgroup/kubepods.slice/pod2/cpu.stat");
        assert_eq!(
            parse_throttled("nr_periods 10\nnr_throttled 4\nthrottled_time 123\n"),
            Some(123)
        );
        assert_eq!(
            parse_throttled("usage_usec 5\nnr_throttled 1\nthrottled_usec 7\n"),
            Some(7_000)
        );
        assert_eq!(parse_throttled("usage_usec 5\n"), None);
    }

    #[test]
    fn this_process_cpu_figures_are_readable() {
        // Busy for a moment so the scheduler has something to account.
        let mut clock = CpuClock::now();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed().as_millis() < 20 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let w = clock.window();
        assert!(w.wall_ns >= 20_000_000 && x > 0);
        assert!(std::path::Path::new("/proc/self/task").exists());
    }
}
