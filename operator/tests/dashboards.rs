//! The Grafana dashboards in `grafana/dashboards/` are well formed, use their
//! datasources consistently, and name only metrics that the agent and the hub
//! export. (The e2e suite `observability` runs their queries against a real
//! Prometheus and PostgreSQL.)

use nextmini_operator::observe::HubMetrics;
use nextmini_operator::observe::dashboards::{
    self, Language, check, exported_names, metric_names, provisioned_datasources,
};
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

fn grafana_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../grafana")
}

fn dashboards() -> Vec<(String, serde_json::Value)> {
    let dir = grafana_dir().join("dashboards");
    let mut out: Vec<(String, serde_json::Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable dashboard");
            let value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()));
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                value,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn dashboards_are_well_formed() {
    let provisioned = provisioned_datasources(
        &std::fs::read_to_string(grafana_dir().join("provisioning/datasources/nextmini.yaml"))
            .expect("datasource provisioning"),
    )
    .expect("valid provisioning");
    let all = dashboards();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in ["overview", "link", "flows", "topology"] {
        assert!(
            names.contains(&format!("nextmini-{wanted}.json").as_str()),
            "no {wanted} dashboard in {names:?}"
        );
    }
    let mut uids = HashSet::new();
    let mut problems = Vec::new();
    for (name, d) in &all {
        problems.extend(
            check(d, &provisioned)
                .into_iter()
                .map(|p| format!("{name}: {p}")),
        );
        assert!(uids.insert(d["uid"].to_string()), "{name}: uid used twice");
        // Variable defaults point at the provisioned datasources.
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] == "datasource" {
                let uid = v["current"]["value"].as_str().unwrap_or_default();
                assert!(
                    provisioned.contains_key(uid),
                    "{name}: variable {} defaults to {uid:?}, which is not provisioned",
                    v["name"]
                );
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let topology = &all
        .iter()
        .find(|(n, _)| n == "nextmini-topology.json")
        .expect("topology dashboard")
        .1;
    assert!(
        topology["panels"]
            .as_array()
            .expect("panels")
            .iter()
            .any(|p| p["type"] == "nodegraph"),
        "the topology dashboard has a Node Graph panel"
    );
}

#[test]
fn dashboards_name_only_exported_metrics() {
    let exported: BTreeSet<String> = exported_names(&nextmini_agent::metrics::describe())
        .into_iter()
        .chain(exported_names(
            &HubMetrics::new().encode().expect("hub metrics"),
        ))
        .collect();
    let mut used = BTreeSet::new();
    for (name, d) in dashboards() {
        let mut queries = dashboards::queries(&d);
        queries.extend(dashboards::variable_queries(&d));
        for q in queries.iter().filter(|q| q.language == Language::PromQl) {
            for metric in metric_names(&q.text) {
                assert!(
                    exported.contains(&metric),
                    "{name}: panel {:?} query {} uses {metric}, which nothing exports (exported: {exported:?})",
                    q.panel,
                    q.ref_id
                );
                used.insert(metric);
            }
        }
    }
    // The families the issue asks dashboards to show are shown.
    for metric in [
        "nextmini_link_bytes_total",
        "nextmini_link_drops_total",
        "nextmini_link_up",
        "nextmini_agent_stream_connected",
        "nextmini_flow_completion_seconds_bucket",
        "nextmini_hub_connected_agents",
    ] {
        assert!(used.contains(metric), "no dashboard shows {metric}");
    }
}

#[test]
fn the_link_dashboard_marks_scenario_events() {
    // Timed scenarios (issue 18.2): each event shows as an annotation at the
    // time it took effect, from the store's timeline.
    let all = dashboards();
    let link = &all
        .iter()
        .find(|(n, _)| n == "nextmini-link.json")
        .expect("link dashboard")
        .1;
    let sql: Vec<&str> = dashboards::annotation_list(link)
        .filter_map(|a| a["target"]["rawSql"].as_str())
        .collect();
    assert!(
        sql.iter()
            .any(|q| q.contains("scenario_timeline") && q.contains("last_applied_at")),
        "no annotation query on scenario_timeline: {sql:?}"
    );
    assert!(
        dashboards::queries(link)
            .iter()
            .any(|q| q.panel.starts_with("annotation") && q.language == Language::Sql),
        "annotation SQL is not among the queries the observability suite runs"
    );
}
