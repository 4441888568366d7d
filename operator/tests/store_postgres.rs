//! The store against a real PostgreSQL (a private instance in a temporary
//! directory, started with the same code local mode uses). Needs root, like the
//! rest of local mode, because PostgreSQL runs as the `postgres` user.

use nextmini_operator::plan::{self, Plan};
use nextmini_operator::store::{CounterRow, Store, TOPOLOGY_CHANNEL};
use std::time::Duration;

#[path = "support/private_db.rs"]
mod private_db;
use private_db::{Db, hashes, planned, start_db};

fn line3() -> Plan {
    let text = include_str!("../../manifests/examples/line3.yaml");
    planned("line3.yaml", text)
}

fn shaped() -> Plan {
    let text = include_str!("../../manifests/examples/shaped.yaml");
    planned("shaped.yaml", text)
}

/// A private database with line3 stored in it: the database (kept running
/// while it lives), a store on it and line3's topology id.
async fn line3_stored(name: &str) -> (Db, Store, i64) {
    let db = start_db(name, 57000);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let plan = line3();
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply");
    let id: i64 = sqlx::query_scalar("SELECT id FROM topologies WHERE name = 'line3'")
        .fetch_one(store.pool())
        .await
        .expect("id");
    (db, store, id)
}

async fn count(store: &Store, table: &str) -> i64 {
    let sql = match table {
        "topologies" => "SELECT count(*) FROM topologies",
        "nodes" => "SELECT count(*) FROM nodes",
        "links" => "SELECT count(*) FROM links",
        "link_counters" => "SELECT count(*) FROM link_counters",
        _ => "SELECT count(*) FROM flows",
    };
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .expect("count")
}

#[tokio::test]
async fn desired_state_round_trips_and_changes_atomically() {
    let db = start_db("roundtrip", 57000);
    let store = Store::connect(&db.pg.url())
        .await
        .expect("connect + migrate");
    // Migrations are idempotent: a second connect must not fail.
    let store2 = Store::connect(&db.pg.url()).await.expect("second connect");
    drop(store2);

    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .expect("listener");
    listener.listen(TOPOLOGY_CHANNEL).await.expect("listen");

    let plan = line3();
    let g1 = store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply");
    assert_eq!(g1, 1);
    let (loaded, generation) = store
        .load_plan("line3")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!(generation, 1);
    assert_eq!(
        loaded, plan,
        "the plan must survive the round trip through rows"
    );

    let g2 = store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("re-apply");
    assert_eq!(g2, 2);
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY within 5 s")
        .expect("notification");
    assert_eq!(note.payload(), "line3", "payload is the name, not the row");

    // A plan the database refuses (a link to a node that is not there) leaves the
    // previous version untouched.
    let mut broken = plan.clone();
    broken.link_mut(0).acceptor = "ghost".into();
    assert!(
        store
            .apply_plan(&broken, "netns", "source", &hashes(&broken))
            .await
            .is_err()
    );
    let (kept, generation) = store
        .load_plan("line3")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!((kept, generation), (plan.clone(), 2));

    let identity = store
        .node_identity("line3", "b")
        .await
        .expect("query")
        .expect("b");
    assert_eq!(identity.credential_sha256, "hash-of-b");
    assert!(
        store
            .node_identity("line3", "zz")
            .await
            .expect("query")
            .is_none()
    );
}

#[tokio::test]
async fn counters_upsert_in_batches_and_everything_goes_with_the_topology() {
    let (_db, store, id) = line3_stored("counters").await;
    let row = |tx: u64| CounterRow {
        topology_id: id,
        node: "b".into(),
        link: "a-b".into(),
        connected: true,
        tx_bytes: tx,
        tx_packets: tx / 1000,
        rx_bytes: 1,
        rx_packets: 1,
        drops: 0,
        connects: 1,
        ..Default::default()
    };
    // The same key twice in one batch: the later row wins, the batch succeeds.
    store
        .record_counters(&[row(100), row(5000)])
        .await
        .expect("batch");
    let status = store
        .status("line3")
        .await
        .expect("status")
        .expect("exists");
    let ab = status.links.iter().find(|l| l.name == "a-b").expect("a-b");
    assert_eq!(
        ab.bytes_backward, 5000,
        "b is a-b's acceptor: its tx is the backward direction"
    );
    assert_eq!(status.nodes.len(), 3);

    store.record_ack(id, "a", 1).await.expect("ack");
    store
        .set_agent_state(id, "a", "connected")
        .await
        .expect("state");
    assert_eq!(
        store.ack_progress("line3", 1).await.expect("progress"),
        (1, 3)
    );

    assert!(store.delete_topology("line3").await.expect("delete"));
    for table in ["topologies", "nodes", "links", "link_counters", "flows"] {
        assert_eq!(
            count(&store, table).await,
            0,
            "{table} rows left after delete"
        );
    }
    // A late report for the deleted topology is dropped, not an error.
    store
        .record_counters(&[row(1)])
        .await
        .expect("stale batch is dropped");
    assert!(!store.delete_topology("line3").await.expect("delete again"));
}

async fn topology_id(store: &Store, name: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM topologies WHERE name = $1")
        .bind(name)
        .fetch_one(store.pool())
        .await
        .expect("topology id")
}

/// Regression: a history batch holding rows of a topology deleted after they were
/// reported failed its foreign key at every retry, so the hub kept no samples of any
/// topology until the bounded buffer had pushed those rows out.
#[tokio::test]
async fn a_deleted_topologys_rows_do_not_poison_a_metrics_batch() {
    let db = start_db("poison", 57000);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let live = line3();
    store
        .apply_plan(&live, "netns", "source", &hashes(&live))
        .await
        .expect("apply line3");
    let gone = shaped();
    store
        .apply_plan(&gone, "netns", "source", &hashes(&gone))
        .await
        .expect("apply shaped");
    let live_id = topology_id(&store, &live.topology).await;
    let gone_id = topology_id(&store, &gone.topology).await;
    let row = |topology_id: i64, tx: u64| CounterRow {
        topology_id,
        node: "a".into(),
        link: "a-b".into(),
        connected: true,
        tx_bytes: tx,
        at: chrono::Utc::now(),
        ..Default::default()
    };
    assert!(store.delete_topology(&gone.topology).await.expect("delete"));
    let batch = [
        row(live_id, 1),
        row(gone_id, 2),
        row(live_id, 3),
        row(gone_id, 4),
    ];
    let left_out = store
        .record_metrics(&batch)
        .await
        .expect("the batch is stored");
    assert_eq!(
        left_out, 2,
        "the deleted topology's rows are left out and counted"
    );
    let stored: Vec<i64> = sqlx::query_scalar(
        "SELECT tx_bytes FROM link_metrics WHERE topology_id = $1 ORDER BY tx_bytes",
    )
    .bind(live_id)
    .fetch_all(store.pool())
    .await
    .expect("history");
    assert_eq!(
        stored,
        [1, 3],
        "the live topology's samples are stored once"
    );
    assert_eq!(
        store
            .record_metrics(&[row(live_id, 5)])
            .await
            .expect("next batch"),
        0
    );
}

#[tokio::test]
async fn link_params_round_trip_and_an_update_in_place_is_a_new_generation() {
    let db = start_db("params", 57000);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let line3 = line3();
    let shaped = shaped();
    for p in [&line3, &shaped] {
        store
            .apply_plan(p, "netns", "source", &hashes(p))
            .await
            .expect("apply");
    }
    let load = |name: &'static str| {
        let store = store.clone();
        async move { store.load_plan(name).await.expect("load").expect("exists") }
    };
    let (loaded, generation) = load("shaped").await;
    assert_eq!(generation, 1);
    assert_eq!(
        loaded, shaped,
        "queue, AQM, scheduler, classes and both directions survive the JSON columns"
    );

    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .expect("listener");
    listener.listen(TOPOLOGY_CHANNEL).await.expect("listen");

    // What a control script does: change one key of one direction in place.
    sqlx::query(
        "UPDATE links SET params_forward = jsonb_set(params_forward, '{rate_bps}', '20000000') \
         WHERE name = 'a-b'",
    )
    .execute(store.pool())
    .await
    .expect("update");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a NOTIFY within 5 s")
        .expect("notification");
    assert_eq!(note.payload(), "line3");
    let (changed, generation) = load("line3").await;
    assert_eq!(generation, 2, "bumped exactly once");
    let ab = changed.link("a-b").expect("a-b");
    assert_eq!(ab.forward.rate_bps, Some(20_000_000));
    assert_eq!(
        ab.backward.rate_bps, None,
        "the other direction is untouched"
    );
    assert_eq!(load("shaped").await.1, 1, "other topologies are untouched");

    // One statement changing several links is one new generation; a statement that
    // leaves every row as it was is none.
    sqlx::query("UPDATE links SET params_backward = jsonb_set(params_backward, '{loss_ppm}', '7')")
        .execute(store.pool())
        .await
        .expect("update all");
    assert_eq!(load("line3").await.1, 3);
    assert_eq!(load("shaped").await.1, 2);
    sqlx::query("UPDATE links SET transport = transport")
        .execute(store.pool())
        .await
        .expect("no-op update");
    assert_eq!(load("line3").await.1, 3);

    // Re-applying deletes and re-inserts links: the topology's own bump, no second one.
    let g = store
        .apply_plan(&line3, "netns", "source", &hashes(&line3))
        .await
        .expect("re-apply");
    assert_eq!(g, 4);
    assert_eq!(load("line3").await, (line3, 4));

    // A misspelt key that got past the database's checks (the operator's own
    // connections skip them) is reported when read, naming the link, column and
    // key, rather than silently leaving the link unshaped; the rest loads.
    sqlx::query(
        r#"UPDATE links SET params_forward = params_forward || '{"rate": 5}' WHERE name = 'core'"#,
    )
    .execute(store.pool())
    .await
    .expect("update");
    let loaded = store
        .load_checked("shaped")
        .await
        .expect("load")
        .expect("exists");
    assert_eq!(loaded.faults.len(), 1, "{:?}", loaded.faults);
    let fault = &loaded.faults[0];
    assert_eq!(fault.subject, "links core params_forward");
    assert!(
        fault
            .problem
            .starts_with("params_forward: unknown key rate"),
        "{}",
        fault.problem
    );
    assert_eq!(
        loaded.plan.links.len(),
        shaped.links.len(),
        "the other links load as stored"
    );
}

/// Rows written before the parameters moved to JSON keep their values, in both directions.
#[tokio::test]
async fn migration_0002_carries_old_link_columns_into_json() {
    let db = start_db("migrate-0002", 57000);
    let pool = sqlx::PgPool::connect(&db.pg.url()).await.expect("connect");
    sqlx::migrate!("./migrations")
        .run_to(1, &pool)
        .await
        .expect("schema of 0001");
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO topologies (name, placement, runtime, overlay, underlay, processors, mapping, mtu, source) \
         VALUES ('old', 'netns', 'netns', '198.18.0.0/16', '198.19.0.0/17', 2, 'sequential', 1400, '') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("topology");
    for (name, idx) in [("a", 0), ("b", 1)] {
        sqlx::query(
            "INSERT INTO nodes (topology_id, name, idx, overlay_addr, underlay_addr, credential_sha256) \
             VALUES ($1, $2, $3, $4, $5, '')",
        )
        .bind(id)
        .bind(name)
        .bind(idx)
        .bind(format!("198.18.0.{}", idx + 1))
        .bind(format!("198.19.0.{}", idx + 1))
        .execute(&pool)
        .await
        .expect("node");
    }
    sqlx::query(
        "INSERT INTO links (topology_id, name, dialer, acceptor, transport, rate_bps, delay_us, jitter_us, loss_ppm, queue_packets) \
         VALUES ($1, 'a-b', 'a', 'b', 'tcp', 100000000, 5000, NULL, 1000, 64)",
    )
    .bind(id)
    .execute(&pool)
    .await
    .expect("old link row");
    pool.close().await;

    let store = Store::connect(&db.pg.url())
        .await
        .expect("migrates the rest");
    let (plan, generation) = store.load_plan("old").await.expect("load").expect("exists");
    assert_eq!(generation, 1, "migrating is not a change of desired state");
    let ab = plan.link("a-b").expect("a-b");
    let expected = plan::LinkParams {
        rate_bps: Some(100_000_000),
        delay: Some(Duration::from_millis(5)),
        loss_ppm: Some(1_000),
        queue: plan::QueueParams {
            limit_packets: Some(64),
            ..plan::QueueParams::default()
        },
        ..plan::LinkParams::default()
    };
    assert_eq!((&ab.forward, &ab.backward), (&expected, &expected));
}

#[tokio::test]
async fn socks_servers_round_trip() {
    let db = start_db("socks", 57000);
    let store = Store::connect(&db.pg.url())
        .await
        .expect("connect + migrate");
    let text = "apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: s}
spec:
  nodes:
    - name: a
      socks:
        - {listen: \"127.0.0.1:1080\"}
        - {listen: \"[::1]:1081\", mode: max, users: [{name: alice, password: secret}]}
    - name: b
";
    let manifest = plan::parse_manifest("s.yaml", text).expect("parses");
    let plan = plan::plan_manifest(&manifest).expect("plans").remove(0);
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply");
    let (loaded, _) = store.load_plan("s").await.expect("load").expect("exists");
    assert_eq!(loaded, plan, "SOCKS servers survive the round trip");
    assert_eq!(loaded.nodes[0].socks.len(), 2);
    let stored: String = sqlx::query_scalar("SELECT socks::text FROM nodes WHERE name = 'a'")
        .fetch_one(store.pool())
        .await
        .expect("socks column");
    assert!(
        !stored.contains("secret"),
        "no password in the store: {stored}"
    );
}

/// `down` of 1,000 agents once failed with "deadlock detected": the DELETE's
/// cascade waited for a counter row that the hub's batch had updated, and the
/// batch's next INSERT waited, checking its foreign key, for the topology row
/// the DELETE held. PostgreSQL aborts one of them; the DELETE must run again
/// and succeed rather than fail `down`.
#[tokio::test]
async fn deleting_a_topology_survives_a_deadlock_with_a_counter_batch() {
    let (_db, store, id) = line3_stored("deadlock").await;
    let counters = |link: &str, node: &str| CounterRow {
        topology_id: id,
        node: node.into(),
        link: link.into(),
        connected: true,
        ..Default::default()
    };
    store
        .record_counters(&[counters("a-b", "b")])
        .await
        .expect("first report");

    // A counter batch in flight: it has updated an existing row...
    let mut batch = store.pool().begin().await.expect("begin");
    sqlx::query("UPDATE link_counters SET tx_bytes = 7 WHERE topology_id = $1 AND link = 'a-b' AND node = 'b'")
        .bind(id)
        .execute(&mut *batch)
        .await
        .expect("update in batch");
    // ...when the topology is deleted; the DELETE locks the topology row and
    // waits for that counter row.
    let deleting = {
        let store = store.clone();
        tokio::spawn(async move { store.delete_topology("line3").await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM topologies%'",
        )
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_activity");
        if waiting == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the DELETE never waited for the batch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The batch's INSERT of a new row needs the topology row (foreign key):
    // a deadlock, and the DELETE, waiting longer, is the one aborted.
    let row = counters("b-c", "c");
    sqlx::query(
        "INSERT INTO link_counters (topology_id, link, node, connected, tx_bytes, tx_packets, rx_bytes, rx_packets, drops, connects) \
         VALUES ($1, $2, $3, true, 0, 0, 0, 0, 0, 0)",
    )
    .bind(row.topology_id)
    .bind(&row.link)
    .bind(&row.node)
    .execute(&mut *batch)
    .await
    .expect("the batch's insert goes through once the DELETE is aborted");
    batch.commit().await.expect("commit batch");

    let deleted = tokio::time::timeout(Duration::from_secs(30), deleting)
        .await
        .expect("the DELETE finishes")
        .expect("task");
    assert!(
        deleted.expect("the deadlocked DELETE is retried"),
        "the topology existed"
    );
    for table in ["topologies", "nodes", "link_counters"] {
        assert_eq!(count(&store, table).await, 0, "{table} rows left");
    }
}

#[tokio::test]
async fn a_recreated_topology_is_a_new_creation_and_its_delete_is_notified() {
    let (_db, store, _) = line3_stored("recreate").await;
    let first = store
        .version("line3")
        .await
        .expect("version")
        .expect("stored");
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .expect("listener");
    listener.listen(TOPOLOGY_CHANNEL).await.expect("listen");

    assert!(store.delete_topology("line3").await.expect("delete"));
    // The hub drops its view of the deleted creation on this notification.
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a DELETE notifies")
        .expect("notification");
    assert_eq!(n.payload(), "line3");
    assert_eq!(store.version("line3").await.expect("version"), None);

    let plan = line3();
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply again");
    let (_, second) = store
        .load_plan_version("line3")
        .await
        .expect("load")
        .expect("stored");
    // Same name, same generation number: only the id tells them apart.
    assert_eq!(second.generation, first.generation);
    assert_ne!(
        second.id, first.id,
        "a re-created topology must be a new creation"
    );

    // An agent pid is replaced only over the pid the row still names.
    store
        .set_node_pid("line3", "a", Some(100))
        .await
        .expect("pid");
    assert!(
        !store
            .replace_node_pid("line3", "a", 99, 101)
            .await
            .expect("cas")
    );
    assert!(
        store
            .replace_node_pid("line3", "a", 100, 101)
            .await
            .expect("cas")
    );
    assert!(store.delete_topology("line3").await.expect("delete"));
    assert!(
        !store
            .replace_node_pid("line3", "a", 101, 102)
            .await
            .expect("cas"),
        "a removed node must not get a pid"
    );
}

/// Issue 16.4: a link changed in place moves the generation but not
/// `plan_generation`, and carries the generation that changed it, so the hub
/// reads that link alone. Two writers of one topology's links stamp their rows
/// in the order they commit, or a hub would miss the second one's change.
#[tokio::test]
async fn links_changed_in_place_are_stamped_with_their_generation() {
    let (_db, store, id) = line3_stored("link-stamps").await;
    let plan_version = || async {
        let (v, plan) = store
            .plan_version("line3")
            .await
            .expect("version")
            .expect("stored");
        (v.generation, plan)
    };
    let changed = |since: i64| {
        let store = store.clone();
        async move {
            let c = store
                .links_changed_since(id, since, 1500)
                .await
                .expect("changed links");
            c.links.into_iter().map(|l| l.name).collect::<Vec<_>>()
        }
    };
    assert_eq!(plan_version().await, (1, 1));
    assert!(changed(0).await.is_empty(), "a fresh apply stamps nothing");

    sqlx::query(
        "UPDATE links SET params_forward = jsonb_set(params_forward, '{delay_us}', '3000') \
         WHERE name = 'b-c'",
    )
    .execute(store.pool())
    .await
    .expect("update");
    assert_eq!(plan_version().await, (2, 1), "the plan stands");
    assert_eq!(changed(1).await, ["b-c"]);
    assert!(changed(2).await.is_empty());
    let c = store
        .links_changed_since(id, 1, 1500)
        .await
        .expect("changed");
    assert_eq!(c.links[0].forward.delay, Some(Duration::from_millis(3)));

    // A statement that leaves the rows as they were stamps nothing.
    sqlx::query("UPDATE links SET transport = transport")
        .execute(store.pool())
        .await
        .expect("no-op");
    assert_eq!(plan_version().await, (2, 1));
    assert!(changed(2).await.is_empty());

    // Two writers at once: the second waits for the first's commit and stamps
    // the generation its own bump gives.
    let mut first = store.pool().begin().await.expect("begin");
    sqlx::query("UPDATE links SET params_forward = jsonb_set(params_forward, '{loss_ppm}', '10') WHERE name = 'a-b'")
        .execute(&mut *first)
        .await
        .expect("first");
    let second = {
        let pool = store.pool().clone();
        tokio::spawn(async move {
            sqlx::query("UPDATE links SET params_backward = jsonb_set(params_backward, '{loss_ppm}', '20') WHERE name = 'b-c'")
                .execute(&pool)
                .await
                .expect("second")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second writer waits for the first"
    );
    first.commit().await.expect("commit");
    second.await.expect("joined");
    assert_eq!(plan_version().await, (4, 1));
    assert_eq!(
        changed(3).await,
        ["b-c"],
        "a hub that read generation 3 must find the second change"
    );
    assert_eq!(changed(2).await, ["a-b", "b-c"]);

    // Anything else is a plan change again.
    let plan = line3();
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("re-apply");
    assert_eq!(plan_version().await, (5, 5));
}

/// Issue 17.5: two namespaces each run a topology called line3. Each is its
/// own row, known by its key; one's change, status and deletion leave the
/// other as it was; the hub's notifications name the key.
#[tokio::test]
async fn the_same_name_in_two_namespaces_is_two_topologies() {
    let db = start_db("namespaces", 57000);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .expect("listener");
    listener.listen(TOPOLOGY_CHANNEL).await.expect("listen");
    let mut a = line3();
    a.topology = "team-a/line3".into();
    let mut b = shaped();
    b.topology = "team-b/line3".into();
    for (plan, runtime) in [(&a, "kubernetes/team-a"), (&b, "kubernetes/team-b")] {
        store
            .apply_plan(plan, runtime, "source", &hashes(plan))
            .await
            .expect("apply");
    }
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT namespace, name, key FROM topologies ORDER BY key")
            .fetch_all(store.pool())
            .await
            .expect("rows");
    assert_eq!(
        rows,
        [
            ("team-a", "line3", "team-a/line3"),
            ("team-b", "line3", "team-b/line3")
        ]
        .map(|(n, t, k)| (n.to_string(), t.to_string(), k.to_string()))
    );
    assert_eq!(
        store.topology_names().await.expect("names"),
        ["team-a/line3", "team-b/line3"]
    );
    for (key, plan) in [("team-a/line3", &a), ("team-b/line3", &b)] {
        let (loaded, _) = store.load_plan(key).await.expect("load").expect("stored");
        assert_eq!(loaded.topology, key);
        assert_eq!(loaded.links, plan.links, "{key} runs its own links");
        assert_eq!(
            store.runtime_of(key).await.expect("runtime").as_deref(),
            Some(format!("kubernetes/{}", key.split('/').next().unwrap_or("")).as_str())
        );
    }
    assert_eq!(store.load_plan("line3").await.expect("load"), None);

    // Applying one again moves only its generation, and says which.
    let before_b = store.version("team-b/line3").await.expect("v").expect("b");
    let mut a2 = a.clone();
    a2.report_interval_ms += 1000;
    store
        .apply_plan(&a2, "kubernetes/team-a", "source 2", &hashes(&a2))
        .await
        .expect("apply a again");
    let mut payloads = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await {
        payloads.push(n.payload().to_string());
    }
    assert!(payloads.iter().all(|p| p == "team-a/line3"), "{payloads:?}");
    assert!(!payloads.is_empty(), "the change is notified by key");
    assert_eq!(
        store.version("team-b/line3").await.expect("v"),
        Some(before_b)
    );

    assert!(store.delete_topology("team-a/line3").await.expect("delete"));
    assert!(
        store
            .load_plan("team-a/line3")
            .await
            .expect("load")
            .is_none()
    );
    let (still, _) = store
        .load_plan("team-b/line3")
        .await
        .expect("load")
        .expect("team-b's line3 stays");
    assert_eq!(still.links, b.links);

    // The database holds the key's parts to their rules, whoever writes.
    let slash = sqlx::query(
        "INSERT INTO topologies (namespace, name, placement, runtime, overlay, underlay, processors, mapping, mtu, source) \
         VALUES ('team/c', 'x', 'netns', 'local', '198.18.0.0/16', '198.19.0.0/17', 2, 'sequential', 1400, '')",
    )
    .execute(store.pool())
    .await
    .expect_err("a namespace with '/' is refused");
    assert!(slash.to_string().contains("namespace"), "{slash}");
}

/// The hub's views pool does not ping a connection before each statement
/// (issue 16.4: that ping was a round trip on every change's path). A
/// connection whose backend ended while idle must then fail its next
/// statement as lost, so the hub reads again, and the pool must open another.
#[tokio::test]
async fn a_views_connection_ended_while_idle_fails_once_as_lost() {
    let (_db, store, _) = line3_stored("viewsidle").await;
    let views = store.dedicated(1);
    assert!(views.plan_version("line3").await.expect("read").is_some());
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND backend_type = 'client backend'",
    )
    .fetch_all(store.pool())
    .await
    .expect("terminate");
    assert!(!ended.is_empty(), "no idle connection to end");
    let e = views
        .plan_version("line3")
        .await
        .expect_err("a statement on the ended connection");
    assert!(
        e.is_connection_lost(),
        "not taken as a lost connection: {e:?}"
    );
    assert!(
        views
            .plan_version("line3")
            .await
            .expect("read again")
            .is_some(),
        "the pool did not replace the ended connection"
    );
}
