//! A packed worker's nodes resolve every node's name: the operator puts the
//! names into ConfigMaps (one file each in a projected volume, updated by the
//! kubelet when nodes come and go), and the worker keeps each node's
//! `/etc/netns/<namespace>/hosts` — which `ip netns exec`, and so
//! `nextmini exec`, mounts over /etc/hosts — equal to their concatenation.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// How often the worker looks for changed names.
pub const REFRESH: Duration = Duration::from_secs(5);
const LOCALHOST: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost\n";

/// The hosts file from the directory's files, in name order. Names starting
/// with a dot are the kubelet's own (`..data`, timestamped directories).
pub fn read(dir: &Path) -> std::io::Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut text = String::from(LOCALHOST);
    for file in files {
        if file.is_file() {
            text.push_str(&std::fs::read_to_string(&file)?);
        }
    }
    Ok(text)
}

/// Writes `text` as `<etc_netns>/<namespace>/hosts` for each namespace, by
/// rename, so a command starting meanwhile reads the old file or the new one.
pub fn write(etc_netns: &Path, namespaces: &[String], text: &str) -> std::io::Result<()> {
    for ns in namespaces {
        let dir = etc_netns.join(ns);
        std::fs::create_dir_all(&dir)?;
        // Staged beside the directory, not in it: `ip netns exec` mounts
        // every file of the directory over its namesake in /etc.
        let staged = etc_netns.join(format!(".{ns}.hosts.new"));
        std::fs::write(&staged, text)?;
        std::fs::rename(&staged, dir.join("hosts"))?;
    }
    Ok(())
}

/// Removes the namespaces' directories under `etc_netns`.
pub fn remove(etc_netns: &Path, namespaces: impl IntoIterator<Item = String>) {
    for ns in namespaces {
        let dir = etc_netns.join(&ns);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "removing a node's hosts file failed");
        }
    }
}

/// Writes the files now, then again whenever the directory's content
/// changes, until `stop` turns true.
pub async fn keep_current(
    dir: PathBuf,
    etc_netns: PathBuf,
    namespaces: Vec<String>,
    mut stop: watch::Receiver<bool>,
) {
    let mut written: Option<String> = None;
    loop {
        match read(&dir) {
            Ok(text) if written.as_ref() != Some(&text) => {
                match write(&etc_netns, &namespaces, &text) {
                    Ok(()) => {
                        tracing::info!(
                            names = text.lines().count().saturating_sub(2),
                            nodes = namespaces.len(),
                            "node names written"
                        );
                        written = Some(text);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "writing the nodes' hosts files failed; node names may not resolve")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "reading the node names failed")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nm-hosts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn the_parts_in_order_after_localhost_without_the_kubelets_entries() {
        let dir = scratch("parts");
        std::fs::write(dir.as_path().join("part-0001"), "10.0.16.2\tb\n").expect("w");
        std::fs::write(dir.as_path().join("part-0000"), "10.0.16.1\ta\n").expect("w");
        std::fs::create_dir(dir.as_path().join("..data")).expect("d");
        std::fs::write(dir.as_path().join("..data/part-0000"), "junk\n").expect("w");
        let text = read(dir.as_path()).expect("read");
        assert_eq!(text, format!("{LOCALHOST}10.0.16.1\ta\n10.0.16.2\tb\n"));
        let etc = scratch("etc");
        let namespaces = vec!["nm-t-a".to_string(), "nm-t-b".to_string()];
        write(etc.as_path(), &namespaces, &text).expect("write");
        assert_eq!(
            std::fs::read_to_string(etc.as_path().join("nm-t-b/hosts")).expect("hosts"),
            text
        );
        remove(etc.as_path(), namespaces);
        assert!(!etc.as_path().join("nm-t-a").exists());
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&etc);
    }
}
