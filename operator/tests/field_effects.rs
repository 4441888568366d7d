//! No field is accepted and ignored. Every leaf path of the Topology, Link and
//! Flow specs (from the generated CRD schemas) must have a row in
//! `tests/fixtures/field_effects.tsv` naming its evidence: a test that fails
//! when the field has no effect, or a corpus file where it is refused. A new
//! field without a row fails here, and so do rows for fields that are gone and
//! evidence that does not exist. The file's header explains its format.

use kube::CustomResourceExt;
use nextmini_operator::api::{Flow, Link, Topology};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const TABLE: &str = "operator/tests/fixtures/field_effects.tsv";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `<Kind> spec.a.b[].c{}` for every leaf of every kind's spec.
fn leaves() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for crd in [Topology::crd(), Link::crd(), Flow::crd()] {
        let kind = crd.spec.names.kind.clone();
        let crd = serde_json::to_value(&crd).expect("CRD serializes");
        let versions = crd["spec"]["versions"].as_array().expect("versions");
        for version in versions {
            let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
            assert!(spec.is_object(), "{kind} has no spec schema");
            walk(&format!("{kind} spec"), spec, &mut out);
        }
    }
    out
}

fn walk(path: &str, schema: &Value, out: &mut BTreeSet<String>) {
    if let Some(props) = schema["properties"].as_object().filter(|p| !p.is_empty()) {
        for (name, sub) in props {
            walk(&format!("{path}.{name}"), sub, out);
        }
    } else if schema["type"] == "array" {
        walk(&format!("{path}[]"), &schema["items"], out);
    } else if schema["additionalProperties"].is_object() {
        walk(&format!("{path}{{}}"), &schema["additionalProperties"], out);
    } else {
        out.insert(path.to_owned());
    }
}

struct Alias {
    name: String,
    prefix: String,
    evidence: Vec<String>,
    line: usize,
}

struct Row {
    evidence: Vec<String>,
    line: usize,
}

#[derive(Default)]
struct Table {
    aliases: Vec<Alias>,
    /// By path: `Kind spec.x` or `@alias.rest`.
    rows: BTreeMap<String, Row>,
    problems: Vec<String>,
}

fn table() -> Table {
    let text = std::fs::read_to_string(repo().join(TABLE)).expect("the table");
    let mut t = Table::default();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        let words = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        match cols.as_slice() {
            ["alias", name, prefix, evidence] if name.starts_with('@') => t.aliases.push(Alias {
                name: name.to_string(),
                prefix: prefix.to_string(),
                evidence: words(evidence),
                line: n,
            }),
            [path, evidence] if !evidence.trim().is_empty() => {
                let row = Row {
                    evidence: words(evidence),
                    line: n,
                };
                if let Some(first) = t.rows.insert(path.to_string(), row) {
                    t.problems.push(format!(
                        "{TABLE}:{n}: {path} is listed twice (also line {})",
                        first.line
                    ));
                }
            }
            _ => t.problems.push(format!(
                "{TABLE}:{n}: expected `<path><TAB><evidence ...>` or `alias<TAB>@name<TAB><prefix><TAB><evidence ...>`, got {line:?}"
            )),
        }
    }
    t
}

impl Table {
    /// The alias whose prefix is the longest one `leaf` lies under, and the rest of it.
    fn alias_of<'a>(&'a self, leaf: &'a str) -> Option<(&'a Alias, &'a str)> {
        self.aliases
            .iter()
            .filter_map(|a| {
                let rest = leaf.strip_prefix(a.prefix.as_str())?.strip_prefix('.')?;
                Some((a, rest))
            })
            .max_by_key(|(a, _)| a.prefix.len())
    }

    /// The row covering `leaf`, by its own path or through an alias.
    fn row_of(&self, leaf: &str) -> Option<&str> {
        if let Some((path, _)) = self.rows.get_key_value(leaf) {
            return Some(path);
        }
        let (alias, rest) = self.alias_of(leaf)?;
        let key = format!("{}.{rest}", alias.name);
        self.rows.get_key_value(&key).map(|(k, _)| k.as_str())
    }
}

#[test]
fn every_crd_field_has_evidence_of_its_effect() {
    let leaves = leaves();
    assert!(
        leaves.len() > 100,
        "only {} leaves: {leaves:?}",
        leaves.len()
    );
    let t = table();
    let mut missing = Vec::new();
    for leaf in &leaves {
        if t.row_of(leaf).is_some() {
            continue;
        }
        let add = match t.alias_of(leaf) {
            Some((alias, rest)) => format!(
                "`{}.{rest}<TAB><evidence>` (it lies under {} {}) or `{leaf}<TAB><evidence>`",
                alias.name, alias.name, alias.prefix
            ),
            None => format!("`{leaf}<TAB><evidence>`"),
        };
        missing.push(format!("{leaf}: no row; add {add}"));
    }
    assert!(
        missing.is_empty(),
        "{} CRD field(s) without evidence in {TABLE}:\n  {}\n\
         Evidence is `<file>::<test fn>` naming a test that fails when the field has no effect \
         (e.g. a planner test showing it changes the plan, as in operator/src/plan/effects_tests.rs), \
         or `refused:<corpus file>` where it is refused. A field that reaches no code must be refused \
         with a message naming it, or made to work, before it gets a row.",
        missing.len(),
        missing.join("\n  ")
    );
}

#[test]
fn every_row_names_a_field_that_exists() {
    let leaves = leaves();
    let t = table();
    let mut problems = t.problems.clone();
    // What each alias's prefixes hold (leaves whose longest alias prefix it is).
    let mut under: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for leaf in &leaves {
        if let Some((alias, rest)) = t.alias_of(leaf) {
            under.entry(alias.prefix.as_str()).or_default().insert(rest);
        }
    }
    for a in &t.aliases {
        if !under.contains_key(a.prefix.as_str()) {
            problems.push(format!(
                "{TABLE}:{}: alias {} at {}: no CRD field has this prefix; remove the line",
                a.line, a.name, a.prefix
            ));
        }
    }
    for (path, row) in &t.rows {
        if let Some(rest) = path.strip_prefix('@') {
            let Some((name, rest)) = rest.split_once('.') else {
                problems.push(format!(
                    "{TABLE}:{}: {path}: expected @alias.field",
                    row.line
                ));
                continue;
            };
            let prefixes: Vec<&Alias> = t.aliases.iter().filter(|a| a.name[1..] == *name).collect();
            if prefixes.is_empty() {
                problems.push(format!(
                    "{TABLE}:{}: {path}: no `alias @{name}` line declares where it applies",
                    row.line
                ));
            }
            for a in prefixes {
                if !under
                    .get(a.prefix.as_str())
                    .is_some_and(|r| r.contains(rest))
                {
                    problems.push(format!(
                        "{TABLE}:{}: {path}: there is no field {}.{rest} (alias line {}); remove the row or fix the path",
                        row.line, a.prefix, a.line
                    ));
                }
            }
        } else if !leaves.contains(path) {
            problems.push(format!(
                "{TABLE}:{}: {path}: no such field in the CRDs; remove the row or fix the path",
                row.line
            ));
        } else if let Some((alias, rest)) = t.alias_of(path)
            && t.rows.contains_key(&format!("{}.{rest}", alias.name))
        {
            problems.push(format!(
                "{TABLE}:{}: {path} is also covered by {}.{rest}; keep one",
                row.line, alias.name
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} stale row(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Whether `file` (Rust source) has a test function `name`: `fn name(` with a
/// `#[...test...]` attribute above it.
fn has_test_fn(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, line)| {
        let l = line.trim_start();
        let Some(after) = l
            .strip_prefix("fn ")
            .or_else(|| l.strip_prefix("async fn "))
            .and_then(|r| r.strip_prefix(name))
        else {
            return false;
        };
        if !after.starts_with('(') {
            return false;
        }
        lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim())
            .take_while(|l| l.starts_with("#[") || l.starts_with("//") || l.ends_with(")]"))
            .any(|l| l.starts_with("#[") && l.contains("test"))
    })
}

fn evidence_problem(path: &str, evidence: &str) -> Option<String> {
    if let Some(file) = evidence.strip_prefix("refused:") {
        let Ok(text) = std::fs::read(repo().join(file)) else {
            return Some(format!("{evidence}: no such file"));
        };
        let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
        let first = String::from_utf8_lossy(first);
        let Some(expect) = first.strip_prefix("# expect: ") else {
            return Some(format!(
                "{evidence}: the file has no `# expect: <field>` first line"
            ));
        };
        // `spec.nodes[1].containers` refuses `spec.nodes[].containers[]`.
        let mut field = String::new();
        let mut in_index = false;
        for c in expect.trim().chars() {
            match c {
                '[' => {
                    in_index = true;
                    field.push(c);
                }
                ']' => {
                    in_index = false;
                    field.push(c);
                }
                _ if in_index => {}
                _ => field.push(c),
            }
        }
        let own = path.split_once(' ').map_or(path, |(_, p)| p);
        if !path.starts_with('@') && !own.starts_with(&field) {
            return Some(format!("{evidence}: refuses {}, not {own}", expect.trim()));
        }
        return None;
    }
    let Some((file, name)) = evidence.split_once("::") else {
        return Some(format!(
            "{evidence}: expected `<file>::<test fn>` or `refused:<corpus file>`"
        ));
    };
    match std::fs::read_to_string(repo().join(file)) {
        Err(_) => Some(format!("{evidence}: no such file {file}")),
        Ok(source) if !has_test_fn(&source, name) => {
            Some(format!("{evidence}: {file} has no test fn {name}"))
        }
        Ok(_) => None,
    }
}

#[test]
fn every_piece_of_evidence_exists() {
    let t = table();
    let mut problems = Vec::new();
    let rows = t
        .rows
        .iter()
        .map(|(p, r)| (p.as_str(), &r.evidence, r.line));
    let aliases = t
        .aliases
        .iter()
        .map(|a| (a.name.as_str(), &a.evidence, a.line));
    for (path, evidence, line) in rows.chain(aliases) {
        if evidence.is_empty() {
            problems.push(format!("{TABLE}:{line}: {path}: no evidence"));
        }
        for e in evidence {
            if let Some(p) = evidence_problem(path, e) {
                problems.push(format!("{TABLE}:{line}: {path}: {p}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} piece(s) of evidence not found (paths are from the repository root):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}
