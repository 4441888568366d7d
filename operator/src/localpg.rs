//! A private PostgreSQL for local mode: initdb into the state directory, its own
//! port, listening only on a Unix socket in that directory (no TCP at all), trust
//! authentication on that socket only. Started on demand, stopped by `down`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LocalPgError {
    #[error(
        "PostgreSQL server binaries not found under /usr/lib/postgresql: install them (`make setup`, or `apt-get install postgresql`) or pass --database-url"
    )]
    NotInstalled,
    #[error("no `postgres` system user to run PostgreSQL as (install Debian's postgresql package)")]
    NoUser,
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

pub const DEFAULT_PORT: u16 = 55432;
const DATABASE: &str = "nextmini";

pub struct LocalPg {
    bin: PathBuf,
    data: PathBuf,
    socket_dir: PathBuf,
    port: u16,
}

impl LocalPg {
    pub fn new(state_dir: &Path, port: u16) -> Result<LocalPg, LocalPgError> {
        Ok(LocalPg {
            bin: find_bin_dir()?,
            data: state_dir.join("postgres"),
            socket_dir: state_dir.join("postgres-run"),
            port,
        })
    }

    /// sqlx URL of the private database (Unix socket).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost:{}/{DATABASE}?host={}",
            self.port,
            self.socket_dir.display()
        )
    }

    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Whether the data directory has been initialised (it may hold topologies
    /// even while the server is stopped).
    pub fn is_initialised(&self) -> bool {
        self.data.join("PG_VERSION").exists()
    }

    /// Whether our server runs: its lock file names a live (not zombie) process.
    pub fn is_running(&self) -> bool {
        self.server_pid()
            .is_some_and(crate::runtime::process::is_running)
    }

    fn server_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// After a kill -9 the lock file stays, and its pid may linger as a zombie
    /// that PostgreSQL's own check takes for a live server; a lock file whose
    /// process is gone is removed so the server can start.
    fn clear_stale_lock(&self) {
        if self.server_pid().is_some() && !self.is_running() {
            tracing::warn!("removing the stale lock file of a PostgreSQL that was killed");
            let _ = std::fs::remove_file(self.data.join("postmaster.pid"));
            let _ = std::fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}", self.port)));
            let _ =
                std::fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}.lock", self.port)));
        }
    }

    /// Initialises (first time), starts (if stopped) and creates the database.
    pub fn ensure_running(&self) -> Result<(), LocalPgError> {
        let user = nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .ok_or(LocalPgError::NoUser)?;
        for dir in [&self.data, &self.socket_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| LocalPgError::Io(dir.display().to_string(), e))?;
            nix::unistd::chown(dir.as_path(), Some(user.uid), Some(user.gid))
                .map_err(|e| LocalPgError::Io(dir.display().to_string(), e.into()))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.data, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| LocalPgError::Io(self.data.display().to_string(), e))?;
        if !self.data.join("PG_VERSION").exists() {
            let out = self.as_postgres(Command::new(self.bin.join("initdb")).args([
                "-D",
                &self.data.to_string_lossy(),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--auth-local=trust",
                "--auth-host=reject",
                "--no-instructions",
            ]))?;
            check("initdb", out)?;
        }
        self.clear_stale_lock();
        if !self.is_running() {
            let log = self.data.join("server.log");
            // fsync=off risks data only when the machine itself crashes; commits
            // stay synchronous so a killed PostgreSQL never forgets a topology
            // that `up` reported as running (`down` would then leave it behind).
            let options = format!(
                "-k {} -p {} -c listen_addresses='' -c max_connections=200 -c fsync=off",
                self.socket_dir.display(),
                self.port
            );
            let out = self.pg_ctl(&[
                "start",
                "-w",
                "-t",
                "60",
                "-l",
                &log.to_string_lossy(),
                "-o",
                &options,
            ])?;
            check("pg_ctl start", out)?;
        }
        self.wait_ready(Duration::from_secs(30))?;
        self.create_database()
    }

    pub fn stop(&self) -> Result<bool, LocalPgError> {
        self.clear_stale_lock();
        if !self.is_running() {
            return Ok(false);
        }
        let out = self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])?;
        check("pg_ctl stop", out)?;
        Ok(true)
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), LocalPgError> {
        let deadline = Instant::now() + limit;
        loop {
            let out = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-h",
                    &self.socket_dir.to_string_lossy(),
                    "-p",
                    &self.port.to_string(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(|e| LocalPgError::Io("pg_isready".into(), e))?;
            if out.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LocalPgError::Command {
                    what: "waiting for PostgreSQL".into(),
                    detail: format!(
                        "not ready after {limit:?}; see {}/server.log",
                        self.data.display()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn create_database(&self) -> Result<(), LocalPgError> {
        let psql = |sql: &str| {
            self.as_postgres(Command::new(self.bin.join("psql")).args([
                "-h",
                &self.socket_dir.to_string_lossy(),
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-tAc",
                sql,
            ]))
        };
        let exists = psql("SELECT 1 FROM pg_database WHERE datname = 'nextmini'")?;
        if String::from_utf8_lossy(&exists.stdout).trim() == "1" {
            return Ok(());
        }
        check(
            "creating database nextmini",
            psql("CREATE DATABASE nextmini")?,
        )
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<std::process::Output, LocalPgError> {
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(&self.data).args(args);
        self.as_postgres(&mut cmd)
    }

    /// PostgreSQL refuses to run as root.
    fn as_postgres(&self, cmd: &mut Command) -> Result<std::process::Output, LocalPgError> {
        let user = nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .ok_or(LocalPgError::NoUser)?;
        cmd.uid(user.uid.as_raw())
            .gid(user.gid.as_raw())
            .current_dir("/")
            .env("HOME", &user.dir)
            .stdin(Stdio::null())
            // The server inherits these: never tie it to our terminal or pipes.
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        cmd.output()
            .map_err(|e| LocalPgError::Io(format!("running {:?}", cmd.get_program()), e))
    }
}

fn check(what: &str, out: std::process::Output) -> Result<(), LocalPgError> {
    if out.status.success() {
        return Ok(());
    }
    Err(LocalPgError::Command {
        what: what.into(),
        detail: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// The newest /usr/lib/postgresql/<major>/bin that has `postgres` in it.
fn find_bin_dir() -> Result<PathBuf, LocalPgError> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| LocalPgError::NotInstalled)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .collect();
    majors.sort();
    majors
        .pop()
        .map(|(_, b)| b)
        .ok_or(LocalPgError::NotInstalled)
}
