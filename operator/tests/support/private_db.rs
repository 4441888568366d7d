//! A private PostgreSQL in a temporary directory, started with the same code
//! local mode uses, stopped and deleted when dropped. Needs root, like the rest
//! of local mode, because PostgreSQL runs as the `postgres` user.

use nextmini_operator::localpg::LocalPg;
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
