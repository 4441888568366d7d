//! The kernel's IPv4 neighbour (ARP) table is one table for every network
//! namespace on the machine: its limits (`net.ipv4.neigh.default.gc_thresh*`,
//! 1,024 entries by default) count the entries of all namespaces together.
//! Each node of a topology holds an entry for every underlay peer it has a link
//! to, so a 1,000-node ring needs 2,000 entries; past the limit the kernel
//! refuses new ones (`neighbor table overflow`) and links silently never come
//! up. So the limits are raised to fit before any node is made.

use super::RuntimeError;
use std::path::Path;

const SYSCTL_DIR: &str = "/proc/sys/net/ipv4/neigh/default";
/// Column 0 of the first data line: entries in the table now, all namespaces.
const ARP_STATS: &str = "/proc/net/stat/arp_cache";

/// What raising the limits changed, for the user to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    pub setting: &'static str,
    pub from: u64,
    pub to: u64,
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "raised net.ipv4.neigh.default.{} from {} to {} (the kernel's neighbour table is shared by every namespace, and each node holds an entry per underlay peer)",
            self.setting, self.from, self.to
        )
    }
}

/// The lowest limit that leaves room for `adding` more entries over `in_use`:
/// gc_thresh3 refuses allocation and gc_thresh2 starts eager garbage
/// collection, so both must stay well above what the links hold; twice the
/// need leaves room for other users of the machine.
pub fn wanted_limit(in_use: u64, adding: u64) -> u64 {
    (in_use + adding) * 2
}

/// Raises gc_thresh2 and gc_thresh3 (never lowers them) so that `adding` more
/// neighbour entries fit; returns what it changed.
pub fn make_room(adding: u64) -> Result<Vec<Raised>, RuntimeError> {
    make_room_in(Path::new(SYSCTL_DIR), Path::new(ARP_STATS), adding)
}

fn make_room_in(dir: &Path, stats: &Path, adding: u64) -> Result<Vec<Raised>, RuntimeError> {
    let in_use = std::fs::read_to_string(stats)
        .ok()
        .and_then(|t| {
            let first = t.lines().nth(1)?.split_whitespace().next()?.to_string();
            u64::from_str_radix(&first, 16).ok()
        })
        .unwrap_or(0);
    let wanted = wanted_limit(in_use, adding);
    let mut raised = Vec::new();
    // thresh3 first: thresh2 must never exceed it.
    for setting in ["gc_thresh3", "gc_thresh2"] {
        let path = dir.join(setting);
        let current: u64 = std::fs::read_to_string(&path)
            .map_err(|e| RuntimeError::io(path.display().to_string(), e))?
            .trim()
            .parse()
            .map_err(|e| RuntimeError::Conflict(format!("{}: {e}", path.display())))?;
        if current >= wanted {
            continue;
        }
        std::fs::write(&path, wanted.to_string()).map_err(|e| {
            RuntimeError::io(
                format!(
                    "raising net.ipv4.neigh.default.{setting} to {wanted} ({adding} more neighbour entries needed; set it yourself with sysctl if this process may not)"
                ),
                e,
            )
        })?;
        raised.push(Raised {
            setting,
            from: current,
            to: wanted,
        });
    }
    Ok(raised)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(std::path::PathBuf);
    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sysctls(thresh2: u64, thresh3: u64, entries: u64) -> Dir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nextmini-neigh-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("gc_thresh2"), format!("{thresh2}\n")).expect("write");
        std::fs::write(dir.join("gc_thresh3"), format!("{thresh3}\n")).expect("write");
        std::fs::write(
            dir.join("stats"),
            format!("entries  allocs\n{entries:08x} 00000001\n{entries:08x} 0\n"),
        )
        .expect("write");
        Dir(dir)
    }

    #[test]
    fn a_thousand_node_ring_raises_the_defaults() {
        let dir = sysctls(512, 1024, 20);
        let raised = make_room_in(dir.path(), &dir.path().join("stats"), 2000).expect("raise");
        assert_eq!(
            raised,
            vec![
                Raised {
                    setting: "gc_thresh3",
                    from: 1024,
                    to: 4040
                },
                Raised {
                    setting: "gc_thresh2",
                    from: 512,
                    to: 4040
                },
            ]
        );
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).expect("read");
        assert_eq!(read("gc_thresh3"), "4040");
        assert!(
            raised[0]
                .to_string()
                .contains("gc_thresh3 from 1024 to 4040")
        );
    }

    #[test]
    fn small_topologies_and_higher_limits_are_left_alone() {
        let dir = sysctls(512, 1024, 0);
        assert!(
            make_room_in(dir.path(), &dir.path().join("stats"), 6)
                .expect("ok")
                .is_empty()
        );
        let dir = sysctls(100_000, 200_000, 5000);
        assert!(
            make_room_in(dir.path(), &dir.path().join("stats"), 20_000)
                .expect("ok")
                .is_empty()
        );
    }
}
