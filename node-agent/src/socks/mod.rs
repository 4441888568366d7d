//! SOCKS5 servers (RFC 1928 CONNECT; no authentication or RFC 1929
//! username/password): the way into the emulated network for applications outside
//! it. The listeners are bound by `main` before the agent enters its namespace, so
//! in local mode they are host addresses; everything the servers connect to is
//! reached from inside the node.
//!
//! A destination is a node name or a node's overlay IPv4 address. In normal mode
//! the server connects to it from inside the node, so the bytes cross the TUN
//! device and the emulated links; in max mode it opens a spliced hop-by-hop path
//! ([`crate::maxmode`]).

pub mod handshake;

use crate::relay::{Mode, Relay, SocksSettings, password_sha256, same_secret};
use handshake::{
    CMD_CONNECT, METHOD_NO_AUTH, METHOD_NONE_ACCEPTABLE, METHOD_USERPASS, ParseError, Reply, Target,
};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// From accepting a client to its CONNECT being answered.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest message is a request with a 255-byte name (262 bytes); a client
/// that sends more before being answered is not speaking SOCKS5.
const MAX_PENDING: usize = 1024;

#[derive(Debug, thiserror::Error)]
enum SocksError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error("the client closed the connection during the handshake")]
    Closed,
    #[error("the client sent {0} bytes without completing a message")]
    TooLong(usize),
    #[error("the client offers none of the methods this server accepts ({0})")]
    NoMethod(&'static str),
    #[error("wrong user name or password for user {0:?}")]
    BadCredentials(String),
    #[error("{1}")]
    Refused(Reply, String),
}

/// Starts a server on each listener. Each one reads its settings from the view
/// at every connection, so later snapshots change users and mode in place.
pub fn spawn(
    listeners: Vec<(SocketAddr, std::net::TcpListener)>,
    relay: Arc<Relay>,
) -> std::io::Result<()> {
    for (addr, listener) in listeners {
        let listener = TcpListener::from_std(listener)?;
        tokio::spawn(serve(addr, listener, relay.clone()));
        tracing::info!(listen = %addr, "SOCKS5 server started");
    }
    Ok(())
}

async fn serve(addr: SocketAddr, listener: TcpListener, relay: Arc<Relay>) {
    loop {
        match listener.accept().await {
            Ok((client, from)) => {
                let relay = relay.clone();
                tokio::spawn(async move {
                    let settings = relay.view.load().socks.get(&addr).cloned();
                    let Some(settings) = settings else {
                        tracing::warn!(listen = %addr, %from, "SOCKS connection refused: no settings for this server yet");
                        return;
                    };
                    if let Err(e) = connection(client, from, &settings, &relay).await {
                        let counter = match e {
                            SocksError::NoMethod(_) | SocksError::BadCredentials(_) => {
                                &relay.counters.socks_refused_auth
                            }
                            SocksError::Refused(
                                Reply::HostUnreachable
                                | Reply::ConnectionRefused
                                | Reply::NetworkUnreachable
                                | Reply::TtlExpired
                                | Reply::GeneralFailure,
                                _,
                            ) => &relay.counters.socks_refused_connect,
                            _ => &relay.counters.socks_refused_request,
                        };
                        counter.fetch_add(1, Relaxed);
                        tracing::info!(listen = %addr, %from, error = %e, "SOCKS connection refused");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(listen = %addr, error = %e, "SOCKS accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Bytes read from the client that no message has taken yet.
struct Inbox {
    buf: Vec<u8>,
}

impl Inbox {
    /// Reads until `parse` finds a whole message; takes only its bytes.
    async fn next<T>(
        &mut self,
        client: &mut TcpStream,
        parse: fn(&[u8]) -> handshake::Parsed<T>,
    ) -> Result<T, SocksError> {
        loop {
            if let Some((msg, used)) = parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(msg);
            }
            if self.buf.len() >= MAX_PENDING {
                return Err(SocksError::TooLong(self.buf.len()));
            }
            let mut chunk = [0u8; 512];
            let n = client.read(&mut chunk).await?;
            if n == 0 {
                return Err(SocksError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

async fn connection(
    mut client: TcpStream,
    from: SocketAddr,
    settings: &SocksSettings,
    relay: &Relay,
) -> Result<(), SocksError> {
    let mut inbox = Inbox { buf: Vec::new() };
    let (target, reply_addr) = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut client, &mut inbox, from, settings, relay),
    )
    .await
    .map_err(|_| {
        SocksError::Refused(Reply::GeneralFailure, "the handshake timed out".to_string())
    })??;
    let _ = client.set_nodelay(true);
    client
        .write_all(&handshake::reply(Reply::Succeeded, reply_addr))
        .await?;
    let mut target = target;
    // Bytes the client sent ahead of the answer belong to the destination.
    if !inbox.buf.is_empty() {
        target.write_all(&inbox.buf).await?;
    }
    match settings.mode {
        Mode::Max => crate::maxmode::relay_max(relay, &client, &target).await,
        Mode::Normal => {
            let counters = &relay.counters;
            let _active = counters.connection(false);
            let meter = crate::maxmode::splice::Meter {
                bytes: counters.bytes(false),
                fallbacks: &counters.splice_fallbacks,
            };
            if let Err(e) = crate::maxmode::splice::relay(&client, &target, &meter).await {
                tracing::debug!(error = %e, "SOCKS connection ended with an error");
            }
        }
    }
    Ok(())
}

/// Greeting, authentication and request; answers every failure to the client.
/// Returns the connection to the destination and the address to report as bound.
async fn handshake(
    client: &mut TcpStream,
    inbox: &mut Inbox,
    from: SocketAddr,
    settings: &SocksSettings,
    relay: &Relay,
) -> Result<(TcpStream, SocketAddr), SocksError> {
    let greeting = inbox.next(client, handshake::parse_greeting).await?;
    let (method, needs) = if settings.users.is_empty() {
        (METHOD_NO_AUTH, "no authentication")
    } else {
        (METHOD_USERPASS, "username/password")
    };
    if !greeting.offers(method) {
        client
            .write_all(&handshake::method_reply(METHOD_NONE_ACCEPTABLE))
            .await?;
        return Err(SocksError::NoMethod(needs));
    }
    client.write_all(&handshake::method_reply(method)).await?;
    if method == METHOD_USERPASS {
        let credentials = inbox.next(client, handshake::parse_credentials).await?;
        let offered = password_sha256(&credentials.user, &credentials.password);
        let ok = settings
            .users
            .get(&credentials.user)
            .is_some_and(|expected| same_secret(expected, &offered));
        client.write_all(&handshake::auth_reply(ok)).await?;
        if !ok {
            return Err(SocksError::BadCredentials(
                String::from_utf8_lossy(&credentials.user).into_owned(),
            ));
        }
    }
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let request = match inbox.next(client, handshake::parse_request).await {
        Ok(r) => r,
        Err(SocksError::Parse(e)) => {
            client
                .write_all(&handshake::reply(e.reply(), unspecified))
                .await?;
            return Err(e.into());
        }
        Err(e) => return Err(e),
    };
    if request.command != CMD_CONNECT {
        let why = format!(
            "command {:#04x} is not supported (only CONNECT)",
            request.command
        );
        return Err(refuse(client, Reply::CommandNotSupported, why).await);
    }
    let view = relay.view.load_full();
    let dst = match &request.target {
        Target::Domain(name, port) => match view.resolve(name) {
            Some(ip) => SocketAddrV4::new(ip, *port),
            None => {
                let why = format!("{name:?} is not a node of this topology");
                return Err(refuse(client, Reply::HostUnreachable, why).await);
            }
        },
        Target::Addr(SocketAddr::V4(a)) if view.is_overlay(*a.ip()) => *a,
        Target::Addr(SocketAddr::V4(a)) => {
            let why = format!("{} is not a node's overlay address", a.ip());
            return Err(refuse(client, Reply::NotAllowed, why).await);
        }
        Target::Addr(SocketAddr::V6(a)) => {
            let why = format!("{a}: the emulated network is IPv4");
            return Err(refuse(client, Reply::AddressTypeNotSupported, why).await);
        }
    };
    let here = view.overlay.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let opened = match settings.mode {
        Mode::Normal => connect_inside(relay, dst).await,
        Mode::Max => {
            crate::maxmode::open(relay, SocketAddrV4::new(here, from.port()), dst, 0).await
        }
    };
    match opened {
        Ok(stream) => {
            let bound = match settings.mode {
                Mode::Normal => stream.local_addr().unwrap_or(unspecified),
                Mode::Max => unspecified,
            };
            tracing::debug!(%from, target = %request.target, %dst, mode = settings.mode.as_str(), "SOCKS CONNECT");
            Ok((stream, bound))
        }
        Err((reply, why)) => Err(refuse(client, reply, format!("{}: {why}", request.target)).await),
    }
}

/// Answers a refused request (the client may be gone already) and says why.
async fn refuse(client: &mut TcpStream, reply: Reply, why: String) -> SocksError {
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let _ = client
        .write_all(&handshake::reply(reply, unspecified))
        .await;
    SocksError::Refused(reply, why)
}

/// Normal mode: an ordinary connection from inside the node, routed by the kernel
/// to the TUN device.
async fn connect_inside(relay: &Relay, dst: SocketAddrV4) -> Result<TcpStream, (Reply, String)> {
    let connect = relay.node.connect(SocketAddr::V4(dst));
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err((Reply::from_io(&e), format!("connecting to {dst}: {e}"))),
        Err(_) => Err((
            Reply::HostUnreachable,
            format!("connecting to {dst} timed out"),
        )),
    }
}
