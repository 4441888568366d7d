//! The Grafana dashboards in `grafana/dashboards/`, as data: their queries
//! (PromQL and SQL, with template variables substituted for a test), the metric
//! names they use, and a structural check of each dashboard. Tests use it to
//! keep the dashboards and the code in step.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Panel types the dashboards may use (all built into Grafana 10+).
pub const PANEL_TYPES: [&str; 8] = [
    "row",
    "timeseries",
    "stat",
    "bargauge",
    "gauge",
    "table",
    "nodegraph",
    "text",
];

/// Grafana's own variables; not defined by a dashboard.
const BUILTIN_VARIABLES: [&str; 6] = [
    "__rate_interval",
    "__interval",
    "__range",
    "__timeFilter",
    "__timeFrom",
    "__timeTo",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    PromQl,
    Sql,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub panel: String,
    pub ref_id: String,
    pub language: Language,
    pub text: String,
}

/// Panels, including those nested in rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every panel query of the dashboard.
pub fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        let title = p["title"].as_str().unwrap_or("").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            let ref_id = t["refId"].as_str().unwrap_or("").to_string();
            if let Some(expr) = t["expr"].as_str() {
                out.push(Query {
                    panel: title.clone(),
                    ref_id,
                    language: Language::PromQl,
                    text: expr.to_string(),
                });
            } else if let Some(sql) = t["rawSql"].as_str() {
                out.push(Query {
                    panel: title.clone(),
                    ref_id,
                    language: Language::Sql,
                    text: sql.to_string(),
                });
            }
        }
    }
    // Annotations' SQL (the scenario's events) runs like a panel's.
    for a in annotation_list(dashboard) {
        if let Some(sql) = a["target"]["rawSql"].as_str() {
            out.push(Query {
                panel: format!("annotation {}", a["name"].as_str().unwrap_or("")),
                ref_id: a["target"]["refId"].as_str().unwrap_or("").to_string(),
                language: Language::Sql,
                text: sql.to_string(),
            });
        }
    }
    out
}

/// The dashboard's annotation queries (Grafana's built-in one has none).
pub fn annotation_list(dashboard: &Value) -> impl Iterator<Item = &Value> {
    dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
}

/// The template variables' own queries (`label_values(...)` or SQL).
pub fn variable_queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("").to_string();
        let text = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .unwrap_or("")
            .to_string();
        let language = if v["datasource"]["type"] == "prometheus" {
            Language::PromQl
        } else {
            Language::Sql
        };
        out.push(Query {
            panel: format!("variable {name}"),
            ref_id: name,
            language,
            text,
        });
    }
    out
}

/// `label_values(SELECTOR, LABEL)` → (SELECTOR, LABEL).
pub fn label_values(query: &str) -> Option<(&str, &str)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}

/// Replaces `$name`, `${name}` and `${name:format}` with the value given for
/// `name`; the value is inserted as is (format the value for its place).
pub fn substitute(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    // Longest names first, so `$node` does not eat the start of `$nodes`.
    let mut sorted: Vec<&(&str, &str)> = values.iter().collect();
    sorted.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    for (name, value) in sorted {
        while let Some(start) = out.find(&format!("${{{name}:")) {
            let Some(len) = out[start..].find('}') else {
                break;
            };
            out.replace_range(start..start + len + 1, value);
        }
        out = out.replace(&format!("${{{name}}}"), value);
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// Variables a text refers to (`$x`, `${x}`, `${x:fmt}`).
pub fn referenced_variables(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let braced = bytes.get(i + 1) == Some(&b'{');
            let start = if braced { i + 2 } else { i + 1 };
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            if end > start {
                out.insert(text[start..end].to_string());
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Names of Nextmini metrics in a PromQL expression.
pub fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut rest = promql;
    while let Some(pos) = rest.find("nextmini_") {
        let preceded = rest[..pos].chars().next_back().is_some_and(is_ident);
        let tail = &rest[pos..];
        let len = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        if !preceded {
            out.insert(tail[..len].to_string());
        }
        rest = &tail[len..];
    }
    out
}

/// The sample names an OpenMetrics exposition makes queryable (`_total` for
/// counters, `_bucket`/`_sum`/`_count` for histograms).
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let Some((name, kind)) = rest.split_once(' ') else {
            continue;
        };
        match kind.trim() {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// Everything structurally wrong with a dashboard, one line each (empty: fine).
/// `provisioned` maps datasource uids defined in provisioning to their types.
pub fn check(dashboard: &Value, provisioned: &HashMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |s: String| problems.push(s);
    for field in ["uid", "title"] {
        if dashboard[field].as_str().is_none_or(str::is_empty) {
            problem(format!("{field}: missing"));
        }
    }
    if dashboard["uid"].as_str().is_some_and(|u| u.len() > 40) {
        problem("uid: longer than Grafana's 40 characters".into());
    }
    if !dashboard["schemaVersion"].is_u64() {
        problem("schemaVersion: missing".into());
    }
    if !dashboard["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|x| x == "nextmini"))
    {
        problem("tags: must include \"nextmini\" (the dashboards link each other by it)".into());
    }
    let Some(variables) = dashboard["templating"]["list"].as_array() else {
        problem("templating.list: missing".into());
        return problems;
    };
    // Datasource variables: name -> plugin type.
    let mut ds_vars: HashMap<String, String> = HashMap::new();
    let mut defined: HashSet<String> = BUILTIN_VARIABLES.iter().map(|s| s.to_string()).collect();
    for v in variables {
        let name = v["name"].as_str().unwrap_or_default().to_string();
        if name.is_empty() {
            problem("templating: a variable has no name".into());
        }
        if v["type"] == "datasource" {
            ds_vars.insert(
                name.clone(),
                v["query"].as_str().unwrap_or_default().to_string(),
            );
        }
        defined.insert(name);
    }
    let datasource_ok = |ds: &Value| -> Result<(), String> {
        let (Some(kind), Some(uid)) = (ds["type"].as_str(), ds["uid"].as_str()) else {
            return Err(format!("datasource {ds} needs a type and a uid"));
        };
        let var = uid
            .strip_prefix("${")
            .and_then(|u| u.strip_suffix('}'))
            .or_else(|| uid.strip_prefix('$'));
        let declared = match var {
            Some(v) => ds_vars
                .get(v)
                .ok_or_else(|| format!("datasource uid {uid} names no datasource variable"))?,
            None => provisioned
                .get(uid)
                .ok_or_else(|| format!("datasource uid {uid} is not provisioned"))?,
        };
        if declared != kind {
            return Err(format!(
                "datasource {uid} is a {declared}, used as a {kind}"
            ));
        }
        Ok(())
    };
    for v in variables.iter().filter(|v| v["type"] == "query") {
        if let Err(e) = datasource_ok(&v["datasource"]) {
            problem(format!("variable {}: {e}", v["name"]));
        }
    }
    for a in annotation_list(dashboard) {
        let at = format!("annotation {:?}", a["name"].as_str().unwrap_or_default());
        if let Err(e) = datasource_ok(&a["datasource"]) {
            problem(format!("{at}: {e}"));
        }
        if a["target"]["rawSql"]
            .as_str()
            .is_none_or(|s| s.trim().is_empty())
        {
            problem(format!("{at}: no SQL"));
        }
    }
    let mut ids = HashSet::new();
    for p in panels(dashboard) {
        let title = p["title"].as_str().unwrap_or_default();
        let at = format!("panel {title:?}");
        let kind = p["type"].as_str().unwrap_or_default();
        if !PANEL_TYPES.contains(&kind) {
            problem(format!("{at}: type {kind:?} is not one of {PANEL_TYPES:?}"));
        }
        if title.is_empty() {
            problem(format!("{at}: no title"));
        }
        match p["id"].as_u64() {
            Some(id) if !ids.insert(id) => problem(format!("{at}: id {id} used twice")),
            Some(_) => {}
            None => problem(format!("{at}: no numeric id")),
        }
        let grid = &p["gridPos"];
        let dims: Vec<Option<u64>> = ["x", "y", "w", "h"]
            .iter()
            .map(|k| grid[*k].as_u64())
            .collect();
        match dims.as_slice() {
            [Some(x), Some(_), Some(w), Some(h)] if x + w <= 24 && *w > 0 && *h > 0 => {}
            _ => problem(format!(
                "{at}: gridPos must have x, y, w, h with x + w <= 24"
            )),
        }
        if kind == "row" || kind == "text" {
            continue;
        }
        if let Err(e) = datasource_ok(&p["datasource"]) {
            problem(format!("{at}: {e}"));
        }
        let Some(targets) = p["targets"].as_array().filter(|t| !t.is_empty()) else {
            problem(format!("{at}: no queries"));
            continue;
        };
        let mut refs = HashSet::new();
        for t in targets {
            let ref_id = t["refId"].as_str().unwrap_or_default();
            if ref_id.is_empty() || !refs.insert(ref_id) {
                problem(format!("{at}: refId {ref_id:?} missing or repeated"));
            }
            if let Err(e) = datasource_ok(&t["datasource"]) {
                problem(format!("{at} query {ref_id}: {e}"));
            }
            let text = match (t["expr"].as_str(), t["rawSql"].as_str()) {
                (Some(e), None) if !e.trim().is_empty() => e,
                (None, Some(s)) if !s.trim().is_empty() => {
                    if t["format"] != "table" && t["format"] != "time_series" {
                        problem(format!(
                            "{at} query {ref_id}: SQL needs format table or time_series"
                        ));
                    }
                    s
                }
                _ => {
                    problem(format!(
                        "{at} query {ref_id}: needs exactly one of expr (PromQL) or rawSql"
                    ));
                    continue;
                }
            };
            for var in referenced_variables(text) {
                if !defined.contains(&var) {
                    problem(format!(
                        "{at} query {ref_id}: ${var} is not a variable of this dashboard"
                    ));
                }
            }
        }
        if kind == "nodegraph" {
            let sql = |r: &str| {
                targets
                    .iter()
                    .find(|t| t["refId"] == r)
                    .and_then(|t| t["rawSql"].as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            let (nodes, edges) = (sql("nodes"), sql("edges"));
            if !nodes.contains(" AS id") {
                problem(format!("{at}: needs a query \"nodes\" with an id column"));
            }
            for column in [" AS id", " AS source", " AS target"] {
                if !edges.contains(column) {
                    problem(format!("{at}: query \"edges\" lacks{column}"));
                }
            }
        }
    }
    problems
}

/// Datasource uids and types from a Grafana provisioning file's `datasources:` list.
pub fn provisioned_datasources(yaml: &str) -> Result<HashMap<String, String>, String> {
    let doc: serde_norway::Value = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    for d in doc
        .get("datasources")
        .and_then(|d| d.as_sequence())
        .ok_or("no datasources list")?
    {
        let uid = d
            .get("uid")
            .and_then(|v| v.as_str())
            .ok_or("a datasource has no uid")?;
        let kind = d
            .get("type")
            .and_then(|v| v.as_str())
            .ok_or("a datasource has no type")?;
        out.insert(uid.to_string(), kind.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_metric_names_and_variables() {
        let q = "sum by (le) (rate(nextmini_hub_db_write_seconds_bucket{topology=~\"$topology\"}[$__rate_interval])) / x_nextmini_no";
        assert_eq!(
            metric_names(q).into_iter().collect::<Vec<_>>(),
            ["nextmini_hub_db_write_seconds_bucket"]
        );
        assert_eq!(
            referenced_variables("a ${topology:sqlstring} $link [$__rate_interval]")
                .into_iter()
                .collect::<Vec<_>>(),
            ["__rate_interval", "link", "topology"]
        );
    }

    #[test]
    fn substitutes_every_form() {
        assert_eq!(
            substitute("${t:sqlstring} ${t} $t $tt", &[("t", "'x'"), ("tt", "y")]),
            "'x' 'x' 'x' y"
        );
        assert_eq!(
            label_values("label_values(up{a=\"b\"}, node)"),
            Some(("up{a=\"b\"}", "node"))
        );
    }

    #[test]
    fn exported_names_follow_types() {
        let names = exported_names("# TYPE a counter\n# TYPE b histogram\n# TYPE c gauge\n");
        assert!(names.contains("a_total") && names.contains("b_bucket") && names.contains("c"));
        assert!(!names.contains("a") && !names.contains("b"));
    }

    #[test]
    fn check_reports_broken_panels() {
        let d = serde_json::json!({
            "uid": "x", "title": "X", "schemaVersion": 39, "tags": ["nextmini"],
            "templating": {"list": [{"name": "prometheus", "type": "datasource", "query": "prometheus"}]},
            "panels": [
                {"id": 1, "type": "timeseries", "title": "ok", "gridPos": {"x": 0, "y": 0, "w": 12, "h": 4},
                 "datasource": {"type": "prometheus", "uid": "${prometheus}"},
                 "targets": [{"refId": "A", "expr": "up", "datasource": {"type": "prometheus", "uid": "${prometheus}"}}]},
                {"id": 1, "type": "piechart", "title": "bad", "gridPos": {"x": 20, "y": 0, "w": 12, "h": 4},
                 "datasource": {"type": "postgres", "uid": "${prometheus}"},
                 "targets": [{"refId": "A", "expr": "x{a=\"$nope\"}", "datasource": {"type": "prometheus", "uid": "pg"}}]}
            ]
        });
        let problems = check(&d, &HashMap::new()).join("\n");
        for needle in [
            "id 1 used twice",
            "piechart",
            "x + w <= 24",
            "is a prometheus, used as a postgres",
            "pg is not provisioned",
            "$nope",
        ] {
            assert!(problems.contains(needle), "{needle:?} not in:\n{problems}");
        }
        assert_eq!(problems.lines().count(), 6, "{problems}");
    }
}
