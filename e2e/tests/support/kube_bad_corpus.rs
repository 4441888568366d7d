//! The bad-input corpus (operator/tests/corpus/bad, plus a generated 10 MB
//! document) through the Kubernetes API, each file on its own in a scratch
//! namespace. A file is refused by kubectl itself (not YAML, not UTF-8, no
//! kind), by the API server (size limit, CRD schema, CEL), or, when the API
//! accepts it, by the operator: `Planned=False` with a message naming the field.
//! Either way no pod and no row may exist for it. A server-side dry run comes
//! first, so a file the API refuses in part is never half applied. kubectl
//! applies a file's documents one at a time, so each file is sent with its
//! Links and Flows before its Topology (documents unchanged): the operator then
//! judges the whole, where the Topology first would run alone for a moment.

use nextmini_e2e::kube::Cluster;
use nextmini_e2e::repo_path;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedBy {
    Kubectl,
    ApiServer,
    Operator,
    /// Not sent: the file holds one object twice, which to the API is an object
    /// and its update (a file is no unit there), so there is nothing to refuse.
    NotApplicable,
    /// Accepted and planned: not refused at all.
    Nobody,
}

impl RefusedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusedBy::Kubectl => "kubectl",
            RefusedBy::ApiServer => "API server",
            RefusedBy::Operator => "operator (Planned=False)",
            RefusedBy::NotApplicable => "not sent: same object twice in one file",
            RefusedBy::Nobody => "NOBODY",
        }
    }
}

pub struct Verdict {
    pub file: String,
    pub field: String,
    pub by: RefusedBy,
    pub message: String,
    pub names_field: bool,
    /// Pods or rows that existed for the file.
    pub created: Vec<String>,
}

#[path = "../../../operator/tests/support/corpus_files.rs"]
mod corpus_files;
use corpus_files::expected_field;

fn corpus() -> Vec<PathBuf> {
    corpus_files::files(&repo_path("operator/tests/corpus/bad"))
}

/// (kind, name) pairs that occur more than once among a file's documents.
fn duplicate_objects(path: &Path) -> Vec<String> {
    let text = String::from_utf8_lossy(&std::fs::read(path).expect("corpus file")).to_string();
    let mut seen = std::collections::BTreeMap::<(String, String), usize>::new();
    for doc in text.split("\n---") {
        let kind = doc
            .lines()
            .find_map(|l| l.strip_prefix("kind:"))
            .map(|k| k.trim().to_string());
        let mut in_metadata = false;
        let mut name = None;
        for l in doc.lines() {
            if let Some(rest) = l.strip_prefix("metadata:") {
                in_metadata = true;
                if let Some(n) = rest.trim().strip_prefix("{name:") {
                    name = Some(n.trim_end_matches('}').trim().to_string());
                }
            } else if in_metadata && l.starts_with("  name:") {
                name = l.split_once(':').map(|(_, n)| n.trim().to_string());
            } else if !l.starts_with(' ') {
                in_metadata = false;
            }
        }
        if let (Some(k), Some(n)) = (kind, name) {
            *seen.entry((k, n)).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((k, n), _)| format!("{k} {n}"))
        .collect()
}

/// The file with its Topology documents moved to the end (each document
/// unchanged); a single document is returned as it is.
fn topology_last(path: &Path, scratch: &Path) -> PathBuf {
    let bytes = std::fs::read(path).expect("corpus file");
    let sep = b"\n---\n";
    let mut docs: Vec<&[u8]> = Vec::new();
    let mut rest: &[u8] = &bytes;
    while let Some(i) = rest.windows(sep.len()).position(|w| w == sep) {
        docs.push(&rest[..i]);
        rest = &rest[i + sep.len()..];
    }
    docs.push(rest);
    if docs.len() < 2 {
        return path.to_path_buf();
    }
    let is_topology = |d: &&[u8]| {
        d.windows(b"kind: Topology".len())
            .any(|w| w == b"kind: Topology")
    };
    let (topologies, others): (Vec<&[u8]>, Vec<&[u8]>) = docs.into_iter().partition(is_topology);
    let mut out = Vec::new();
    for (i, d) in others.into_iter().chain(topologies).enumerate() {
        if i > 0 {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(d);
    }
    out.push(b'\n');
    let reordered = scratch.join(path.file_name().expect("name"));
    std::fs::write(&reordered, out).expect("reordered file");
    reordered
}

/// Waits until the scratch namespace holds nothing of the last file: no
/// Nextmini object, no pod, no row of its topologies.
fn wait_empty(c: &Cluster, ns: &str, topologies: &[String]) {
    c.wait_for(
        "the scratch namespace to be empty",
        Duration::from_secs(120),
        || {
            let objects = c.kubectl_in(ns, &["get", "topologies,links,flows,pods", "-o", "name"]);
            objects.status.success()
                && objects.stdout.iter().all(u8::is_ascii_whitespace)
                && created(c, ns, topologies).is_empty()
        },
    );
}

/// The operator's log lines of the last minute that mention `topology`.
fn operator_log(c: &Cluster, topology: &str) -> String {
    let out = c.kubectl(&[
        "logs",
        &format!("deploy/{}-operator", c.release),
        "--since=60s",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(&format!("\"{topology}\""))
                || l.contains(&format!("topology={topology}"))
                || l.contains("WARN")
                || l.contains("ERROR")
        })
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// A Topology of more than 10 MB, which the API server's request limit refuses.
fn huge_document(dir: &Path) -> PathBuf {
    let mut text = String::from(
        "# expect: (document)\napiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: huge}\nspec:\n  nodes:\n",
    );
    let mut i = 0;
    while text.len() < 10 * 1024 * 1024 {
        text.push_str(&format!("    - name: node-{i}\n"));
        i += 1;
    }
    let path = dir.join("082-ten-megabytes.yaml");
    std::fs::write(&path, text).expect("huge manifest");
    path
}

/// Whether `message` names `field`: the whole path; or an enclosing object's
/// path and the field's own name (a CEL rule on `spec.queue.aqm.red` saying
/// `min` must be below `max`); or for whole-document problems anything at all
/// (there is no field to name).
fn names(message: &str, field: &str, by: RefusedBy) -> bool {
    if field == "(document)" || field == "not UTF-8" {
        return !message.trim().is_empty();
    }
    // kubectl's own errors speak of the field in words, not paths.
    if by == RefusedBy::Kubectl {
        let lower = message.to_lowercase();
        let leaf = field.rsplit('.').next().unwrap_or(field).to_lowercase();
        return lower.contains(&leaf)
            || (leaf == "apiversion" && lower.contains("in version"))
            || (leaf == "name" && lower.contains("name may not be empty"));
    }
    if message.contains(field) {
        return true;
    }
    let leaf = field
        .rsplit('.')
        .next()
        .unwrap_or(field)
        .split('[')
        .next()
        .unwrap_or_default();
    let mut path = field;
    while let Some(cut) = path.rfind(['.', '[']) {
        path = &path[..cut];
        let named =
            message.contains(path) && (path.contains('.') || message.contains(&format!("{path}:")));
        if named && message.contains(leaf) {
            return true;
        }
    }
    // Top-level fields (kind, metadata, spec) are named by themselves.
    !field.contains('.') && message.contains(leaf)
}

fn text(out: &std::process::Output) -> String {
    let mut s = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if s.is_empty() {
        s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    s
}

fn one_line(s: &str) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.len() > 220 {
        format!("{}…", &s[..s.floor_char_boundary(220)])
    } else {
        s
    }
}

/// Topology names that a corpus file's objects belong to (by the
/// `nextmini.io/topology` of Links and Flows, or their own name).
fn topologies_in(c: &Cluster, ns: &str) -> Vec<String> {
    let out = c.kubectl_in(
        ns,
        &[
            "get",
            "topologies",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The Planned condition of a topology: (status, message), once the operator set it.
fn planned(c: &Cluster, ns: &str, topology: &str) -> Option<(String, String)> {
    let out = c.kubectl_in(
        ns,
        &[
            "get",
            "topology",
            topology,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Planned")].status}|{.status.conditions[?(@.type=="Planned")].message}"#,
        ],
    );
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    let (status, message) = s.split_once('|')?;
    (!status.is_empty()).then(|| (status.to_string(), message.to_string()))
}

/// The messages of Links and Flows with `Accepted=False` (a Topology that
/// does not exist), waiting up to 15 s for the operator to write them.
fn not_accepted(c: &Cluster, ns: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = c.kubectl_in(
            ns,
            &[
                "get",
                "links,flows",
                "-o",
                r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Accepted")].status}|{.status.conditions[?(@.type=="Accepted")].message}{"\n"}{end}"#,
            ],
        );
        let messages: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("False|").map(str::to_string))
            .collect();
        if !messages.is_empty() {
            return Some(messages.join("; "));
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// What exists for the file beyond its own objects: pods, and rows in the store.
fn created(c: &Cluster, ns: &str, topologies: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let pods = c.kubectl_in(ns, &["get", "pods", "-o", "name"]);
    for p in String::from_utf8_lossy(&pods.stdout).lines() {
        found.push(p.to_string());
    }
    for t in topologies {
        let rows = c.psql(&format!(
            "SELECT count(*) FROM topologies WHERE name = '{}'",
            t.replace('\'', "''")
        ));
        if rows != "0" {
            found.push(format!("row of topology {t}"));
        }
    }
    found
}

fn line3_ready(c: &Cluster) -> bool {
    c.kubectl(&[
        "get",
        "topology",
        "line3",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
    ])
    .stdout
        == b"True"
}

/// Sends every file through the API in namespace `ns` (created and removed
/// here), checking after each that line3 in the suite's namespace stays Ready.
pub fn run(c: &Cluster, ns: &str) -> Vec<Verdict> {
    let scratch = std::env::temp_dir().join(format!("nextmini-kube-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let mut files = corpus();
    assert!(files.len() >= 60, "the corpus has {} files", files.len());
    files.push(huge_document(&scratch));
    let made = c.kubectl_in(ns, &["create", "namespace", ns]);
    assert!(made.status.success(), "{}", text(&made));
    let mut verdicts = Vec::new();
    for path in &files {
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let field = expected_field(path);
        let twice = duplicate_objects(path);
        let sent = topology_last(path, &scratch);
        let p = sent.to_str().expect("UTF-8 path");
        if !twice.is_empty() {
            verdicts.push(Verdict {
                names_field: true,
                message: format!(
                    "{} twice: kubectl would apply the second over the first",
                    twice.join(", ")
                ),
                file,
                field,
                by: RefusedBy::NotApplicable,
                created: Vec::new(),
            });
            continue;
        }
        let mut member_only = false;
        let dry = c.kubectl_in(ns, &["apply", "--dry-run=server", "-f", p]);
        let (by, message) = if !dry.status.success() {
            let m = text(&dry);
            let by = if m.contains("Error from server") || m.contains("is invalid") {
                RefusedBy::ApiServer
            } else {
                RefusedBy::Kubectl
            };
            (by, m)
        } else {
            let applied = c.kubectl_in(ns, &["apply", "-f", p]);
            if !applied.status.success() {
                (RefusedBy::ApiServer, text(&applied))
            } else {
                // The operator's verdict on each Topology of the file.
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut verdict = None;
                while verdict.is_none() && Instant::now() < deadline {
                    let ts = topologies_in(c, ns);
                    let seen: Vec<(String, String)> =
                        ts.iter().filter_map(|t| planned(c, ns, t)).collect();
                    if !ts.is_empty() && seen.len() == ts.len() {
                        verdict = Some(seen);
                    } else {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                match verdict {
                    Some(seen) if seen.iter().any(|(s, _)| s == "False") => {
                        let m = seen
                            .iter()
                            .filter(|(s, _)| s == "False")
                            .map(|(_, m)| m.as_str())
                            .collect::<Vec<_>>()
                            .join("; ");
                        (RefusedBy::Operator, m)
                    }
                    Some(seen) => match not_accepted(c, ns) {
                        Some(m) => {
                            // The refused object is a Link or Flow; its file's
                            // Topologies were valid and run, as they should.
                            member_only = true;
                            (RefusedBy::Operator, m)
                        }
                        None => (
                            RefusedBy::Nobody,
                            format!(
                                "planned: {}",
                                seen.iter()
                                    .map(|(_, m)| m.as_str())
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            ),
                        ),
                    },
                    None => (
                        RefusedBy::Nobody,
                        format!(
                            "no Planned condition within 30 s; operator: {}",
                            operator_log(c, "t")
                        ),
                    ),
                }
            }
        };
        let topologies = topologies_in(c, ns);
        if by != RefusedBy::Kubectl {
            // A plan stored by mistake would show its pods within a moment.
            std::thread::sleep(Duration::from_secs(1));
        }
        let leftovers = if member_only {
            Vec::new()
        } else {
            created(c, ns, &topologies)
        };
        let _ = c.kubectl_in(
            ns,
            &[
                "delete",
                "topologies,links,flows",
                "--all",
                "--wait=true",
                "--timeout=60s",
            ],
        );
        wait_empty(c, ns, &topologies);
        assert!(
            line3_ready(c),
            "line3 stopped being Ready while {file} was being refused"
        );
        verdicts.push(Verdict {
            names_field: names(&message, &field, by),
            file,
            field,
            by,
            message: one_line(&message),
            created: leftovers,
        });
    }
    let _ = c.kubectl_in(ns, &["delete", "namespace", ns, "--timeout=120s"]);
    let _ = std::fs::remove_dir_all(&scratch);
    verdicts
}

/// Files the cluster does not refuse yet, and why; RELIABILITY.md lists them
/// too. The suite fails when another file joins them, and when one is fixed
/// (then it leaves this list).
pub const KNOWN_GAPS: [(&str, &str); 0] = [];

/// The Markdown table of how each file was refused.
pub fn table(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "| file | field | refused by | names the field | created | message |\n|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} |\n",
            v.file,
            v.field,
            v.by.as_str(),
            if v.names_field { "yes" } else { "NO" },
            if v.created.is_empty() {
                "nothing".to_string()
            } else {
                v.created.join(", ")
            },
            v.message.replace('|', "\\|"),
        ));
    }
    out
}

/// What the cluster suite reads from the corpus, checked without a cluster.
#[test]
fn corpus_files_are_read_as_the_cluster_suite_needs() {
    let files = corpus();
    let twice: Vec<String> = files
        .iter()
        .filter(|p| !duplicate_objects(p).is_empty())
        .map(|p| p.file_name().expect("name").to_string_lossy().to_string())
        .collect();
    assert_eq!(
        twice,
        ["022-duplicate-link-name.yaml", "024-duplicate-flow.yaml"]
    );

    let scratch =
        std::env::temp_dir().join(format!("nextmini-corpus-order-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch");
    let flow = files
        .iter()
        .find(|p| p.ends_with("075-flow-disconnected.yaml"))
        .expect("075");
    let sent = std::fs::read_to_string(topology_last(flow, &scratch)).expect("reordered");
    let (link, flow_at, topology) = (
        sent.find("kind: Link").expect("Link"),
        sent.find("kind: Flow").expect("Flow"),
        sent.find("kind: Topology").expect("Topology"),
    );
    assert!(link < topology && flow_at < topology, "{sent}");
    assert_eq!(sent.matches("\n---\n").count(), 2, "{sent}");
    let single = files
        .iter()
        .find(|p| p.ends_with("001-missing-api-version.yaml"))
        .expect("001");
    assert_eq!(&topology_last(single, &scratch), single);
    let _ = std::fs::remove_dir_all(&scratch);

    let api = RefusedBy::ApiServer;
    for (message, field, by, named) in [
        (
            r#"The Topology "t" is invalid: spec.nodes[1]: Duplicate value: {"name":"a"}"#,
            "spec.nodes[1].name",
            api,
            true,
        ),
        (
            r#"The Flow "f" is invalid: spec: Invalid value: "object": src and dst must be different nodes"#,
            "spec.dst",
            api,
            true,
        ),
        (
            r#"The Link "a-b" is invalid: spec.queue.aqm.red: Invalid value: "object": red: min must be less than max"#,
            "spec.queue.aqm.red.min",
            api,
            true,
        ),
        (
            r#"no matches for kind "Topology" in version "nextmini.io/v2""#,
            "apiVersion",
            RefusedBy::Kubectl,
            true,
        ),
        (
            r#"Name: "", Namespace: "x": resource name may not be empty"#,
            "metadata.name",
            RefusedBy::Kubectl,
            true,
        ),
        (
            "link/a-b: spec.rate: must be greater than 0",
            "spec.rate",
            RefusedBy::Operator,
            true,
        ),
        (
            r#"The Link "a-b" is invalid: spec.delay: Invalid value"#,
            "spec.rate",
            api,
            false,
        ),
        (
            "planned: the spec is valid",
            "spec.topology",
            RefusedBy::Nobody,
            false,
        ),
    ] {
        assert_eq!(names(message, field, by), named, "{field} in {message:?}");
    }
}
