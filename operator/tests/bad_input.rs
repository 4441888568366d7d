//! The bad-input corpus (operator/tests/corpus/bad): every malformed manifest is
//! refused by the real CLI before anything is created, with an error naming the
//! file, the document and the field (each file's first line says which field).
//! `nextmini plan` runs the same validation as `up` and needs no root.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/corpus_files.rs"]
mod corpus_files;
use corpus_files::expected_field;

fn corpus() -> Vec<PathBuf> {
    corpus_files::files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/bad"))
}

fn plan(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nextmini"))
        .arg("plan")
        .arg("-f")
        .arg(path)
        .env(
            "NEXTMINI_STATE_DIR",
            std::env::temp_dir().join("nextmini-bad-input-unused"),
        )
        .output()
        .expect("running nextmini plan");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_malformed_manifest_is_refused_naming_document_and_field() {
    let files = corpus();
    assert!(
        files.len() >= 60,
        "the corpus has only {} inputs",
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name");
        let field = expected_field(path);
        let (accepted, stderr) = plan(path);
        let names_document = stderr.contains(&format!("{name} document ")) || stderr.contains(name);
        let names_field = if field == "not UTF-8" {
            stderr.contains("not UTF-8")
        } else {
            stderr.contains(&format!(": {field}: "))
        };
        if accepted || !names_document || !names_field {
            failures.push(format!("{name} (expected field {field}):\n{stderr}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} input(s) not refused as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_ten_megabyte_document_is_refused_before_it_is_parsed() {
    let dir = std::env::temp_dir().join(format!("nextmini-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("huge.yaml");
    let mut text = String::from(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: huge}\nspec:\n  nodes:\n",
    );
    let mut i = 0;
    while text.len() < 10 * 1024 * 1024 {
        text.push_str(&format!("    - name: node-{i}\n"));
        i += 1;
    }
    std::fs::write(&path, &text).expect("huge manifest");
    let started = std::time::Instant::now();
    let (accepted, stderr) = plan(&path);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!accepted);
    assert!(
        stderr.contains("huge.yaml document 1") && stderr.contains("at most 1.5 MiB"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refusing took {:?}",
        started.elapsed()
    );
}
