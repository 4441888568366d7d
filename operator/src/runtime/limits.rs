//! Machine-wide limits that thousands of agents reach before anything else
//! does, checked before the first node is made (issue 16.6). Every agent is a
//! process of a few threads, each a task that counts against `kernel.pid_max`
//! and `kernel.threads-max` (32,768 and a RAM-sized number by default, so a
//! 10,000-node topology's 30,000 threads do not fit the first), against the
//! `pids.max` of the cgroup `nextmini` runs in, and each connects to the hub,
//! which holds a descriptor per agent. Past a limit the kernel refuses a
//! `clone()` or an `accept()` and a node silently never comes up; here the
//! kernel settings are raised, as `neigh` does for the neighbour table, and
//! what cannot be raised is refused by name with the setting that raises it.

use super::RuntimeError;
use std::path::{Path, PathBuf};

/// Tasks (threads) of one agent process: the main thread, two runtime
/// workers, and the node-side thread packed workers add; one more for slack.
pub const TASKS_PER_AGENT: u64 = 5;
/// Descriptors the hub keeps besides its sessions (database pool, listeners,
/// logs, metrics), with room to spare.
const HUB_FDS_BESIDES_SESSIONS: u64 = 1024;
/// The largest `kernel.pid_max` a 64-bit kernel takes.
const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;

/// A kernel setting raised for the topology, for the user to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    pub setting: &'static str,
    pub from: u64,
    pub to: u64,
    pub why: String,
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "raised {} from {} to {} ({})",
            self.setting, self.from, self.to, self.why
        )
    }
}

/// Where the settings and counts are read (a directory of files in tests).
#[derive(Debug, Clone)]
pub struct Sources {
    pub proc_sys_kernel: PathBuf,
    pub loadavg: PathBuf,
    /// The `pids.max` and `pids.current` of the cgroup this process runs in.
    pub cgroup_dir: Option<PathBuf>,
}

impl Sources {
    pub fn this_machine() -> Sources {
        Sources {
            proc_sys_kernel: PathBuf::from("/proc/sys/kernel"),
            loadavg: PathBuf::from("/proc/loadavg"),
            cgroup_dir: own_cgroup_dir(),
        }
    }
}

/// The cgroup v2 directory of this process, if it has one.
fn own_cgroup_dir() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')))
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Tasks on the machine now: the fourth field of /proc/loadavg is
/// "runnable/total".
fn tasks_now(loadavg: &Path) -> u64 {
    std::fs::read_to_string(loadavg)
        .ok()
        .and_then(|t| {
            let field = t.split_whitespace().nth(3)?;
            field.split_once('/')?.1.parse().ok()
        })
        .unwrap_or(0)
}

/// Makes room for `agents` more agent processes: raises `kernel.pid_max` and
/// `kernel.threads-max` to twice what the machine's tasks and theirs need
/// (never lowers them), and refuses, naming the setting, a cgroup `pids.max`
/// or a descriptor limit that cannot hold them.
pub fn make_room_for_agents(agents: u64, sources: &Sources) -> Result<Vec<Raised>, RuntimeError> {
    let needed = tasks_now(&sources.loadavg) + agents * TASKS_PER_AGENT;
    if let Some(dir) = &sources.cgroup_dir
        && let (Ok(max), current) = (
            std::fs::read_to_string(dir.join("pids.max")),
            read_number(&dir.join("pids.current")).unwrap_or(0),
        )
        && let Ok(max) = max.trim().parse::<u64>()
        && current + agents * TASKS_PER_AGENT > max
    {
        return Err(RuntimeError::Conflict(format!(
            "{agents} agents need about {} tasks (threads) and the cgroup this runs in ({}) allows {max}, {current} in use: raise its pids.max (for a systemd unit or session, TasksMax=, e.g. `systemctl set-property <unit> TasksMax=infinity`)",
            agents * TASKS_PER_AGENT,
            dir.display()
        )));
    }
    let wanted = needed * 2;
    if wanted > PID_MAX_LIMIT {
        return Err(RuntimeError::Conflict(format!(
            "{agents} agents need about {needed} tasks on this machine, more than Linux's largest kernel.pid_max ({PID_MAX_LIMIT}) leaves room for: use fewer nodes per machine"
        )));
    }
    let mut raised = Vec::new();
    for setting in ["pid_max", "threads-max"] {
        let path = sources.proc_sys_kernel.join(setting);
        let Some(current) = read_number(&path) else {
            continue;
        };
        if current >= wanted {
            continue;
        }
        std::fs::write(&path, wanted.to_string()).map_err(|e| {
            RuntimeError::io(
                format!(
                    "raising kernel.{setting} from {current} to {wanted} ({agents} agents of {TASKS_PER_AGENT} tasks each; set it yourself with `sysctl kernel.{setting}={wanted}` if this process may not)"
                ),
                e,
            )
        })?;
        raised.push(Raised {
            setting: if setting == "pid_max" {
                "kernel.pid_max"
            } else {
                "kernel.threads-max"
            },
            from: current,
            to: wanted,
            why: format!(
                "every thread takes a task id; {agents} agents add about {}",
                agents * TASKS_PER_AGENT
            ),
        });
    }
    Ok(raised)
}

/// Raises `net.core.netdev_max_backlog` (never lowers it) so that one
/// broadcast flooded over the underlay's bridges fits the per-CPU queue it
/// crosses: every veth port of a bridge takes a copy through that queue, and
/// a broadcast between two segments is flooded on three bridges of up to
/// 1,000 ports each. With the default of 1,000, ARP requests between segments
/// were dropped at random and links of a 5,000-node ring never came up.
pub fn make_room_for_floods(
    nodes: u64,
    per_bridge: u64,
    net_core: &Path,
) -> Result<Option<Raised>, RuntimeError> {
    let bridges_crossed = nodes.div_ceil(per_bridge.max(1)).min(3);
    let wanted = 2 * nodes.min(per_bridge) * bridges_crossed;
    let path = net_core.join("netdev_max_backlog");
    let Some(current) = read_number(&path) else {
        return Ok(None);
    };
    if current >= wanted {
        return Ok(None);
    }
    std::fs::write(&path, wanted.to_string()).map_err(|e| {
        RuntimeError::io(
            format!(
                "raising net.core.netdev_max_backlog from {current} to {wanted} (a broadcast on the underlay is copied to every bridge port; set it yourself with `sysctl net.core.netdev_max_backlog={wanted}` if this process may not)"
            ),
            e,
        )
    })?;
    Ok(Some(Raised {
        setting: "net.core.netdev_max_backlog",
        from: current,
        to: wanted,
        why: format!(
            "a broadcast on the underlay is copied to each of up to {} bridge ports at once",
            nodes.min(per_bridge) * bridges_crossed
        ),
    }))
}

/// Checks that the hub can hold a session per agent: `sessions` descriptors
/// plus its own, against the open-file limit it gets from this process (the
/// hard limit, since it raises its soft one: [`raise_open_files`]).
pub fn check_open_files(sessions: u64) -> Result<(), RuntimeError> {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(|e| RuntimeError::io("reading the open-file limit", e.into()))?;
    let needed = sessions + HUB_FDS_BESIDES_SESSIONS;
    if hard != nix::sys::resource::RLIM_INFINITY && hard < needed {
        return Err(RuntimeError::Conflict(format!(
            "the hub holds a connection per agent: {sessions} agents need about {needed} open files, and the hard limit here is {hard}: raise it (`ulimit -Hn {needed}` as root in the shell that runs nextmini, or LimitNOFILE= for a systemd unit)"
        )));
    }
    Ok(())
}

/// Raises this process's soft open-file limit to its hard one (children
/// inherit it): the soft default of 1,024 is below one descriptor per agent
/// at scale, and only the hard limit is the administrator's choice.
pub fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::debug!(error = %e, soft, hard, "could not raise the open-file limit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn machine(
        pid_max: u64,
        threads_max: u64,
        tasks: u64,
        pids: Option<(&str, u64)>,
    ) -> (Dir, Sources) {
        let root = std::env::temp_dir().join(format!(
            "nextmini-limits-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let kernel = root.join("kernel");
        std::fs::create_dir_all(&kernel).expect("dir");
        std::fs::write(kernel.join("pid_max"), format!("{pid_max}\n")).expect("write");
        std::fs::write(kernel.join("threads-max"), format!("{threads_max}\n")).expect("write");
        std::fs::write(root.join("loadavg"), format!("0.1 0.2 0.3 2/{tasks} 999\n"))
            .expect("write");
        let cgroup_dir = pids.map(|(max, current)| {
            let dir = root.join("cgroup");
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("pids.max"), format!("{max}\n")).expect("write");
            std::fs::write(dir.join("pids.current"), format!("{current}\n")).expect("write");
            dir
        });
        let sources = Sources {
            proc_sys_kernel: kernel,
            loadavg: root.join("loadavg"),
            cgroup_dir,
        };
        (Dir(root), sources)
    }

    fn read(sources: &Sources, setting: &str) -> u64 {
        read_number(&sources.proc_sys_kernel.join(setting)).expect("number")
    }

    /// This machine's default pid_max (32,768) cannot hold 10,000 agents'
    /// threads: it is raised before the first node starts, and said so.
    #[test]
    fn ten_thousand_agents_raise_the_task_limits() {
        let (_dir, sources) = machine(32_768, 192_731, 400, Some(("max", 300)));
        let raised = make_room_for_agents(10_000, &sources).expect("room");
        let wanted = (400 + 10_000 * TASKS_PER_AGENT) * 2;
        assert_eq!(read(&sources, "pid_max"), wanted);
        assert_eq!(read(&sources, "threads-max"), 192_731, "already enough");
        assert_eq!(raised.len(), 1);
        assert!(
            raised[0]
                .to_string()
                .contains("raised kernel.pid_max from 32768 to"),
            "{}",
            raised[0]
        );
        // A second look finds room and changes nothing.
        assert!(
            make_room_for_agents(10_000, &sources)
                .expect("room")
                .is_empty()
        );
        // A small topology changes nothing on a default machine.
        let (_dir, sources) = machine(32_768, 192_731, 400, None);
        assert!(
            make_room_for_agents(100, &sources)
                .expect("room")
                .is_empty()
        );
    }

    #[test]
    fn the_backlog_holds_a_broadcast_flooded_over_three_bridges() {
        let (dir, _) = machine(32_768, 192_731, 400, None);
        let core = dir.0.join("core");
        std::fs::create_dir_all(&core).expect("dir");
        std::fs::write(core.join("netdev_max_backlog"), "1000\n").expect("write");
        assert_eq!(
            make_room_for_floods(400, 1000, &core).expect("ok"),
            None,
            "one small bridge fits"
        );
        let raised = make_room_for_floods(5000, 1000, &core)
            .expect("ok")
            .expect("raised");
        assert_eq!((raised.from, raised.to), (1000, 6000));
        assert_eq!(read_number(&core.join("netdev_max_backlog")), Some(6000));
        assert_eq!(make_room_for_floods(10_000, 1000, &core).expect("ok"), None);
    }

    #[test]
    fn a_cgroup_task_limit_is_refused_by_name() {
        let (_dir, sources) = machine(4_000_000, 4_000_000, 400, Some(("10000", 120)));
        let err = make_room_for_agents(10_000, &sources).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("pids.max") && text.contains("TasksMax"),
            "{text}"
        );
        assert_eq!(
            read(&sources, "pid_max"),
            4_000_000,
            "nothing raised on refusal"
        );
        assert!(make_room_for_agents(1_000, &sources).is_ok());
    }

    #[test]
    fn beyond_the_kernels_largest_pid_max_is_refused() {
        let (_dir, sources) = machine(32_768, 192_731, 400, None);
        let err = make_room_for_agents(1_000_000, &sources).expect_err("refused");
        assert!(err.to_string().contains("kernel.pid_max"), "{err}");
        assert_eq!(read(&sources, "pid_max"), 32_768);
    }

    #[test]
    fn the_open_file_limit_must_hold_a_session_per_agent() {
        let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .expect("limit");
        if hard == nix::sys::resource::RLIM_INFINITY {
            return;
        }
        assert!(check_open_files(10).is_ok());
        let err = check_open_files(hard).expect_err("refused");
        assert!(err.to_string().contains("ulimit -Hn"), "{err}");
    }
}
