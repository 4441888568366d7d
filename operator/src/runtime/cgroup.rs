//! Per-node CPU and memory limits in namespace mode (the Mininet-HiFi lesson: a
//! busy node must not starve the others' forwarding). cgroup v2 (`cpu.max`,
//! `memory.max`) where the unified hierarchy is mounted, v1 (`cpu.cfs_quota_us`,
//! `memory.limit_in_bytes`) otherwise. A node's agent and every command run in
//! the node with `nextmini exec` join its group.

use super::RuntimeError;
use crate::plan::Resources;
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";
const PARENT: &str = "nextmini";
/// Scheduler period for CPU quotas (the kernel default).
const PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

fn version() -> Option<Version> {
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        Some(Version::V2)
    } else if Path::new(ROOT).join("cpu").is_dir() {
        Some(Version::V1)
    } else {
        None
    }
}

/// The group's name: unique per topology and node, like the namespace.
pub fn group_name(netns: &str) -> String {
    netns.to_string()
}

fn dirs(group: &str) -> Vec<(PathBuf, &'static str)> {
    match version() {
        Some(Version::V2) => vec![(Path::new(ROOT).join(PARENT).join(group), "unified")],
        Some(Version::V1) => ["cpu", "memory"]
            .into_iter()
            .map(|c| (Path::new(ROOT).join(c).join(PARENT).join(group), c))
            .collect(),
        None => vec![],
    }
}

fn write(path: &Path, value: &str) -> Result<(), RuntimeError> {
    std::fs::write(path, value)
        .map_err(|e| RuntimeError::io(format!("writing {value:?} to {}", path.display()), e))
}

/// Creates the node's group with its limits. `Ok(false)` when the node has no
/// limits (nothing is created).
pub fn create(group: &str, resources: &Resources) -> Result<bool, RuntimeError> {
    if resources.cpu_millis.is_none() && resources.memory_bytes.is_none() {
        return Ok(false);
    }
    let Some(version) = version() else {
        return Err(RuntimeError::Conflict(
            "node resources are set but no cgroup hierarchy is mounted at /sys/fs/cgroup".into(),
        ));
    };
    let quota = resources
        .cpu_millis
        .map(|m| (u64::from(m) * PERIOD_US / 1000).max(1000));
    match version {
        Version::V2 => {
            let parent = Path::new(ROOT).join(PARENT);
            std::fs::create_dir_all(&parent)
                .map_err(|e| RuntimeError::io(parent.display().to_string(), e))?;
            // Controllers must be enabled on the way down before a child can use them.
            write(
                &Path::new(ROOT).join("cgroup.subtree_control"),
                "+cpu +memory",
            )?;
            write(&parent.join("cgroup.subtree_control"), "+cpu +memory")?;
            let dir = parent.join(group);
            std::fs::create_dir_all(&dir)
                .map_err(|e| RuntimeError::io(dir.display().to_string(), e))?;
            if let Some(q) = quota {
                write(&dir.join("cpu.max"), &format!("{q} {PERIOD_US}"))?;
            }
            if let Some(m) = resources.memory_bytes {
                write(&dir.join("memory.max"), &m.to_string())?;
            }
        }
        Version::V1 => {
            for (dir, controller) in dirs(group) {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| RuntimeError::io(dir.display().to_string(), e))?;
                match controller {
                    "cpu" => {
                        if let Some(q) = quota {
                            write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                            write(&dir.join("cpu.cfs_quota_us"), &q.to_string())?;
                        }
                    }
                    _ => {
                        if let Some(m) = resources.memory_bytes {
                            write(&dir.join("memory.limit_in_bytes"), &m.to_string())?;
                        }
                    }
                }
            }
        }
    }
    Ok(true)
}

/// Inside a container (a packed worker pod): makes the pod's own cgroups
/// writable, so nodes get groups of their own below them. Container runtimes
/// mount each cgroup v1 controller read-only as a bind mount of the container's
/// group; a remount of that bind mount (CAP_SYS_ADMIN) makes it writable and
/// changes nothing else. Children's limits are bounded by the pod's.
///
/// cgroup v2 is refused: there the container's group would have to hand its
/// processes to a leaf before it can enable controllers for children, and
/// every later `kubectl exec` would then fail to join it.
pub fn prepare_nested() -> Result<(), RuntimeError> {
    use nix::mount::{MsFlags, mount};
    match version() {
        Some(Version::V1) => {}
        Some(Version::V2) => {
            return Err(RuntimeError::Conflict(
                "per-node limits in a worker pod need cgroup v1; on cgroup v2 the pod's own limits (the sum of its nodes') apply".into(),
            ));
        }
        None => {
            return Err(RuntimeError::Conflict(
                "no cgroup hierarchy is mounted at /sys/fs/cgroup".into(),
            ));
        }
    }
    for controller in ["cpu", "memory"] {
        let dir = Path::new(ROOT).join(controller);
        let writable =
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok() && !read_only(&dir);
        if writable {
            continue;
        }
        let flags = MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC;
        mount(None::<&str>, &dir, None::<&str>, flags, None::<&str>).map_err(|e| {
            RuntimeError::io(format!("remounting {} writable", dir.display()), e.into())
        })?;
    }
    Ok(())
}

/// Whether the file system holding `dir` is mounted read-only.
fn read_only(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// Moves a process into the node's group, if the group exists.
pub fn join(group: &str, pid: u32) -> Result<(), RuntimeError> {
    for (dir, _) in dirs(group) {
        if dir.is_dir() {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
    }
    Ok(())
}

/// Removes the groups whose name `matches` (their processes must be gone).
pub fn remove_matching(matches: &dyn Fn(&str) -> bool) -> usize {
    let parents: Vec<PathBuf> = match version() {
        Some(Version::V2) => vec![Path::new(ROOT).join(PARENT)],
        Some(Version::V1) => ["cpu", "memory"]
            .into_iter()
            .map(|c| Path::new(ROOT).join(c).join(PARENT))
            .collect(),
        None => vec![],
    };
    let mut removed = 0;
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && matches(&name) && std::fs::remove_dir(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}
