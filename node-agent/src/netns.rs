//! Entering a named network namespace (one made by the runtime under /run/netns).

use std::fs::File;

/// Moves the calling thread into `/run/netns/<name>`. Call it before any other
/// thread exists, so that every thread of the process lives in the namespace.
pub fn enter(name: &str) -> std::io::Result<()> {
    if name.contains('/') || name.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("bad namespace name {name:?}"),
        ));
    }
    let file = File::open(format!("/run/netns/{name}"))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}
