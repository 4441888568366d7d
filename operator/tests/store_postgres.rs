//! The store against a real PostgreSQL (a private instance in a temporary
//! directory, started with the same code local mode uses). Needs root, like the
//! rest of local mode, because PostgreSQL runs as the `postgres` user.

use nextmini_operator::localpg::LocalPg;
use nextmini_operator::plan::{self, Plan};
use nextmini_operator::store::{CounterRow, Store, TOPOLOGY_CHANNEL};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

struct Db {
    pg: LocalPg,
    dir: PathBuf,
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self.pg.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_db(name: &str) -> Db {
    let dir = std::env::temp_dir().join(format!("nextmini-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let port = 57000 + (std::process::id() % 500) as u16 + name.len() as u16;
    let pg = LocalPg::new(&dir, port).expect("PostgreSQL installed");
    pg.ensure_running().expect("PostgreSQL starts");
    Db { pg, dir }
}

fn line3() -> Plan {
    let text = include_str!("../../manifests/examples/line3.yaml");
    let manifest = plan::parse_manifest("line3.yaml", text).expect("parses");
    plan::plan_manifest(&manifest).expect("plans").remove(0)
}

fn hashes(plan: &Plan) -> BTreeMap<String, String> {
    plan.nodes
        .iter()
        .map(|n| (n.name.clone(), format!("hash-of-{}", n.name)))
        .collect()
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
    let db = start_db("roundtrip");
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
    broken.links[0].acceptor = "ghost".into();
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
    let db = start_db("counters");
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
