//! A private PostgreSQL in a temporary directory, started with the same code
//! local mode uses, stopped and deleted when dropped, and the plans the store
//! suites write into it. Needs root, like the rest of local mode, because
//! PostgreSQL runs as the `postgres` user.

use nextmini_operator::localpg::LocalPg;
use nextmini_operator::plan::{Plan, parse_manifest, plan_manifest};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub struct Db {
    pub pg: LocalPg,
    dir: PathBuf,
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self.pg.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a database for the test `name`; `base` keeps suites' ports apart.
pub fn start_db(name: &str, base: u16) -> Db {
    let dir = std::env::temp_dir().join(format!("nextmini-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let port = base + (std::process::id() % 300) as u16 + name.len() as u16;
    let pg = LocalPg::new(&dir, port).expect("PostgreSQL installed");
    pg.ensure_running().expect("PostgreSQL starts");
    Db { pg, dir }
}

/// The first topology of a manifest, planned.
pub fn planned(name: &str, text: &str) -> Plan {
    let manifest = parse_manifest(name, text).expect("parses");
    plan_manifest(&manifest).expect("plans").remove(0)
}

/// A stand-in credential hash per node, as `apply_plan` wants them.
pub fn hashes(plan: &Plan) -> BTreeMap<String, String> {
    plan.nodes
        .iter()
        .map(|n| (n.name.clone(), format!("hash-of-{}", n.name)))
        .collect()
}
