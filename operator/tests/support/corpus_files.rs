//! The bad-input corpus's files and what each must be refused for. Shared by
//! the local suite (`operator/tests/bad_input.rs`) and the cluster suite
//! (`e2e/tests/support/kube_bad_corpus.rs`), which include this file by path.

use std::path::{Path, PathBuf};

/// The corpus's YAML files in `dir`, sorted by name.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("corpus directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The field a corpus file must be refused for: its `# expect:` first line.
pub fn expected_field(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("corpus file");
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(first)
        .strip_prefix("# expect: ")
        .unwrap_or_else(|| panic!("{} lacks its `# expect:` line", path.display()))
        .trim()
        .to_string()
}
