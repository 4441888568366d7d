//! Flows and their results in a real PostgreSQL: definitions survive a
//! re-applied manifest, explicit paths become route rows, and results are
//! stored once per instance however often an agent reports them. Needs root,
//! like the rest of local mode (PostgreSQL runs as `postgres`).

use nextmini_operator::plan::{FlowAmount, Plan};
use nextmini_operator::store::{ReceivedRow, SentRow, Store, route_name};
use std::collections::BTreeMap;

#[path = "support/private_db.rs"]
mod private_db;
use private_db::{hashes, planned, start_db};

fn workloads() -> Plan {
    let text = include_str!("fixtures/workloads.yaml");
    planned("workloads.yaml", text)
}

fn sent(flow: &str, generation: i64, instance: i32, bytes: i64) -> SentRow {
    let at = chrono::DateTime::from_timestamp_micros(1_000_000).unwrap_or_default();
    SentRow {
        flow: flow.into(),
        defined_generation: generation,
        instance,
        protocol: "tcp".into(),
        size_bytes: Some(bytes),
        bytes,
        started_at: at,
        finished_at: Some(at + chrono::Duration::milliseconds(20)),
        fct_us: Some(20_000),
        throughput_bps: Some(bytes as f64 * 8.0 / 0.02),
        retransmissions: 1,
        error: None,
    }
}

#[tokio::test]
async fn flows_keep_their_definition_and_results_are_stored_once() {
    let db = start_db("flows", 57600);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let mut plan = workloads();
    let id: i64 = {
        store
            .apply_plan(&plan, "netns", "test", &hashes(&plan))
            .await
            .expect("apply");
        sqlx::query_scalar("SELECT id FROM topologies WHERE name = 'wl'")
            .fetch_one(store.pool())
            .await
            .expect("id")
    };
    let (loaded, generation) = store.load_plan("wl").await.expect("load").expect("exists");
    let flow = |p: &Plan, name: &str| {
        p.flows
            .iter()
            .find(|f| f.name == name)
            .cloned()
            .expect("flow")
    };
    let web = flow(&loaded, "web");
    assert_eq!(
        web.defined_generation, generation,
        "defined by the last generation"
    );
    assert_eq!(
        web.params,
        flow(&plan, "web").params,
        "params round-trip through JSONB"
    );
    assert!(matches!(web.params.amount, FlowAmount::Cdf(_)));
    let (routes, _) = store.routes("wl").await.expect("routes");
    let route = routes
        .iter()
        .find(|r| r.name == route_name("web"))
        .expect("a route for the explicit path");
    assert_eq!(route.path, ["a", "b", "c"]);
    assert_eq!(web.route_id, Some(route.id));
    assert_eq!(flow(&loaded, "custom").route_id, None, "no path, no route");

    // Stored once per instance, however often reported; a result of another
    // definition (an old generation) is not stored at all.
    let rows = [
        sent("web", generation, 0, 1000),
        sent("web", generation, 1, 2000),
    ];
    assert_eq!(store.record_flow_sent(id, &rows).await.expect("store"), 2);
    assert_eq!(store.record_flow_sent(id, &rows).await.expect("again"), 2);
    let stale = [
        sent("web", generation - 1, 2, 3000),
        sent("ghost", generation, 0, 1),
    ];
    assert_eq!(store.record_flow_sent(id, &stale).await.expect("stale"), 0);
    let stored = store
        .flow_results(Some("wl"), Some("web"))
        .await
        .expect("results");
    assert_eq!(stored.len(), 2);
    assert_eq!((stored[0].src.as_str(), stored[0].dst.as_str()), ("a", "c"));
    assert_eq!(stored[1].fct_us, Some(20_000));

    // A sink's count joins the source's row of the same instance.
    let at = chrono::DateTime::from_timestamp_micros(1_000_000).unwrap_or_default();
    let gen_cbr = flow(&loaded, "cbr").defined_generation;
    let received = ReceivedRow {
        flow: "cbr".into(),
        defined_generation: gen_cbr,
        instance: 0,
        started_at: at,
        received_bytes: 900,
    };
    store
        .record_flow_received(id, std::slice::from_ref(&received))
        .await
        .expect("received");
    store
        .record_flow_sent(
            id,
            &[SentRow {
                protocol: "udp".into(),
                ..sent("cbr", gen_cbr, 0, 1000)
            }],
        )
        .await
        .expect("sent");
    let cbr = store
        .flow_results(Some("wl"), Some("cbr"))
        .await
        .expect("cbr");
    assert_eq!((cbr[0].bytes, cbr[0].received_bytes), (1000, Some(900)));

    // Applied again with one flow changed: the others keep their definition,
    // route and results; the changed one gets the new generation and loses
    // the results of its old definition.
    if let Some(f) = plan.flows.iter_mut().find(|f| f.name == "custom") {
        f.params.seed = 99;
    }
    store
        .apply_node_changes(&plan, "test", &[], &BTreeMap::new())
        .await
        .expect("apply in place");
    store
        .record_flow_sent(
            id,
            &[sent(
                "custom",
                flow(&loaded, "custom").defined_generation,
                0,
                5,
            )],
        )
        .await
        .expect("old custom");
    let (after, _) = store.load_plan("wl").await.expect("load").expect("exists");
    assert_eq!(
        flow(&after, "web").defined_generation,
        web.defined_generation
    );
    assert_eq!(flow(&after, "web").route_id, web.route_id);
    assert!(flow(&after, "custom").defined_generation > web.defined_generation);
    assert_eq!(
        store
            .flow_results(Some("wl"), Some("web"))
            .await
            .expect("web")
            .len(),
        2
    );
    assert!(
        store
            .flow_results(Some("wl"), Some("custom"))
            .await
            .expect("custom")
            .is_empty(),
        "a result of the old definition is not stored"
    );

    // Removed from the manifest: the flow and its route go, its results stay.
    plan.flows.retain(|f| f.name != "web");
    store
        .apply_node_changes(&plan, "test", &[], &BTreeMap::new())
        .await
        .expect("apply in place");
    let (routes, _) = store.routes("wl").await.expect("routes");
    assert!(routes.iter().all(|r| r.name != route_name("web")));
    assert_eq!(
        store
            .flow_results(Some("wl"), Some("web"))
            .await
            .expect("kept")
            .len(),
        2
    );

    // Every node has to acknowledge a generation, and every link be up, before
    // its flows are ready.
    let ready = store.readiness(id).await.expect("ready");
    assert_eq!((ready.acked, ready.links_up, ready.ready()), (0, false, 0));
    drop(db);
}
