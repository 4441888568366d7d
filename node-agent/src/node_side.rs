//! The node's own end of the agent: where its TUN device is made and from where
//! it connects to the node's applications.
//!
//! Usually the whole agent runs in the node's network namespace and this is
//! "here". In a packed worker pod the agent stays in the pod's namespace, where
//! the hub, the peers' pods and the cluster DNS are reachable, and only this end
//! lives in the node's namespace: one thread that entered it (`setns` acts on
//! the calling thread only) makes the TUN device and the sockets that must start
//! there. A device or socket keeps the namespace it was made in, so everything
//! else uses them from any thread. No address translation is needed on either
//! side.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use tokio::net::{TcpSocket, TcpStream};

type Job = Box<dyn FnOnce() + Send>;

/// Cheap to clone; every clone talks to the same thread.
#[derive(Clone, Default)]
pub struct NodeSide {
    /// `None`: the calling thread is already in the node's namespace.
    thread: Option<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for NodeSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.thread.is_some() {
            "NodeSide(thread)"
        } else {
            "NodeSide(here)"
        })
    }
}

impl NodeSide {
    /// The node's namespace is the one every thread of the agent is in.
    pub fn here() -> NodeSide {
        NodeSide::default()
    }

    /// A thread in `/run/netns/<name>`.
    pub fn enter(name: &str) -> io::Result<NodeSide> {
        if name.contains('/') || name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad namespace name {name:?}"),
            ));
        }
        NodeSide::in_namespace(File::open(format!("/run/netns/{name}"))?)
    }

    /// A thread in the network namespace `ns` (an open namespace file, such as
    /// `/run/netns/<name>` or `/proc/<pid>/ns/net`). It stops when the last clone
    /// is dropped.
    pub fn in_namespace(ns: File) -> io::Result<NodeSide> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (entered_tx, entered_rx) = mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name("node-side".into())
            .spawn(move || {
                let entered = nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from);
                let ok = entered.is_ok();
                let _ = entered_tx.send(entered);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })?;
        entered_rx
            .recv()
            .map_err(|_| io::Error::other("the node-side thread died"))??;
        Ok(NodeSide { thread: Some(tx) })
    }

    /// Whether work is sent to a thread of its own.
    pub fn is_thread(&self) -> bool {
        self.thread.is_some()
    }

    /// Runs `job` in the node's namespace and returns what it returned. Jobs run
    /// one at a time, so they must be quick (socket and device creation are).
    pub async fn run<R, F>(&self, job: F) -> io::Result<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let Some(thread) = &self.thread else {
            return Ok(job());
        };
        let (done, result) = tokio::sync::oneshot::channel();
        let boxed: Job = Box::new(move || {
            let _ = done.send(job());
        });
        thread
            .send(boxed)
            .map_err(|_| io::Error::other("the node-side thread stopped"))?;
        result
            .await
            .map_err(|_| io::Error::other("the node-side thread dropped a job"))
    }

    /// A TCP connection that starts in the node's namespace: to the node's own
    /// applications, or through its TUN device to other nodes.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        if self.thread.is_none() {
            return TcpStream::connect(addr).await;
        }
        let fd = self.run(move || tcp_socket(addr)).await??;
        TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
            .connect(addr)
            .await
    }
}

/// An unconnected, non-blocking TCP socket for `addr`'s family, made in the
/// calling thread's namespace.
fn tcp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A fresh, unnamed network namespace held open by a file, or `None` when
    /// this process may not make one (not root).
    fn scratch_namespace() -> Option<File> {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            File::open("/proc/thread-self/ns/net").ok()
        })
        .join()
        .ok()
        .flatten()
    }

    fn namespace_id(path: &str) -> std::path::PathBuf {
        std::fs::read_link(path).expect("a namespace link")
    }

    #[tokio::test]
    async fn here_runs_jobs_inline() {
        let side = NodeSide::here();
        assert!(!side.is_thread());
        let here = std::thread::current().id();
        let ran_on = side.run(|| std::thread::current().id()).await.expect("ran");
        assert_eq!(ran_on, here);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stream, accepted) = tokio::join!(side.connect(addr), listener.accept());
        stream.expect("connects in this namespace");
        accepted.expect("accepted");
    }

    #[tokio::test]
    async fn a_missing_namespace_is_an_error() {
        let e = NodeSide::enter("nextmini-no-such-namespace").expect_err("must fail");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(NodeSide::enter("../etc").is_err());
    }

    /// The socket made by the node side lives in the node's namespace, not in
    /// the agent's: a listener there is reached through it, and a listener in
    /// the agent's namespace on the same port is not.
    #[tokio::test]
    async fn sockets_of_the_node_side_live_in_its_namespace() {
        let Some(ns) = scratch_namespace() else {
            eprintln!("skipped: making a network namespace needs CAP_SYS_ADMIN (run as root)");
            assert_ne!(nix::unistd::geteuid().as_raw(), 0, "root must be able to");
            return;
        };
        let side = NodeSide::in_namespace(ns).expect("enter");
        assert!(side.is_thread());
        let theirs = side
            .run(|| namespace_id("/proc/thread-self/ns/net"))
            .await
            .expect("ran");
        assert_ne!(
            theirs,
            namespace_id("/proc/thread-self/ns/net"),
            "the job ran in the other namespace"
        );
        // Loopback starts down in a new namespace: bring it up from inside.
        let up = side
            .run(|| {
                std::process::Command::new("ip")
                    .args(["link", "set", "lo", "up"])
                    .status()
            })
            .await
            .expect("ran")
            .expect("ip runs");
        assert!(up.success());
        // A listener made in the node's namespace.
        let std_listener = side
            .run(|| {
                let l = std::net::TcpListener::bind("127.0.0.1:0")?;
                l.set_nonblocking(true)?;
                Ok::<_, io::Error>(l)
            })
            .await
            .expect("ran")
            .expect("bind inside");
        let inside = tokio::net::TcpListener::from_std(std_listener).expect("register");
        let addr = inside.local_addr().expect("addr");
        // Nothing listens on that port in the agent's own namespace.
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the agent's namespace has no such listener"
        );
        let (client, accepted) = tokio::join!(side.connect(addr), inside.accept());
        let mut client = client.expect("the node side reaches it");
        let (mut server, _) = accepted.expect("accepted");
        client.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");
    }
}
