//! SOCKS5 messages a server reads and writes (RFC 1928 and RFC 1929), without I/O.
//!
//! Each `parse_*` function looks at the bytes received so far and answers
//! `Ok(None)` when the message is not complete yet, `Ok(Some((message, used)))`
//! with the number of bytes it took, or an error that no further byte can fix.
//! Bytes after `used` belong to what follows, so a client that sends ahead loses
//! nothing. The functions never panic, whatever the input (fuzzed: see
//! `fuzz/fuzz_targets/socks5.rs`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use thiserror::Error;

pub const VERSION: u8 = 5;
/// RFC 1929's sub-negotiation version.
pub const USERPASS_VERSION: u8 = 1;

pub const METHOD_NO_AUTH: u8 = 0x00;
pub const METHOD_USERPASS: u8 = 0x02;
pub const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;

pub const CMD_CONNECT: u8 = 0x01;

const ATYP_V4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_V6: u8 = 0x04;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("SOCKS version {0} (only 5 is spoken)")]
    Version(u8),
    #[error("the greeting offers no method")]
    NoMethods,
    #[error("username/password sub-negotiation version {0} (only 1 exists)")]
    AuthVersion(u8),
    #[error("reserved byte is {0:#04x}, not 0")]
    Reserved(u8),
    #[error("address type {0:#04x} is unknown")]
    AddressType(u8),
    #[error("empty domain name")]
    EmptyDomain,
    #[error("domain name is not UTF-8")]
    DomainNotUtf8,
}

impl ParseError {
    /// What to answer a request that failed to parse with (RFC 1928 section 6).
    pub fn reply(&self) -> Reply {
        match self {
            ParseError::AddressType(_) => Reply::AddressTypeNotSupported,
            _ => Reply::GeneralFailure,
        }
    }
}

/// The client's greeting: the authentication methods it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub methods: Vec<u8>,
}

impl Greeting {
    pub fn offers(&self, method: u8) -> bool {
        self.methods.contains(&method)
    }
}

/// RFC 1929 credentials. Either may be empty (length 0 is legal on the wire).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: Vec<u8>,
    pub password: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &String::from_utf8_lossy(&self.user))
            .finish_non_exhaustive()
    }
}

/// Where the client wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// A name and port (`--socks5-hostname`): here, a node name.
    Domain(String, u16),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::Domain(d, p) => write!(f, "{d}:{p}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: u8,
    pub target: Target,
}

/// Reply codes (RFC 1928 section 6). Max-mode hops answer with the same codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    NetworkUnreachable = 0x03,
    HostUnreachable = 0x04,
    ConnectionRefused = 0x05,
    TtlExpired = 0x06,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

impl Reply {
    pub fn from_code(code: u8) -> Reply {
        match code {
            0x00 => Reply::Succeeded,
            0x02 => Reply::NotAllowed,
            0x03 => Reply::NetworkUnreachable,
            0x04 => Reply::HostUnreachable,
            0x05 => Reply::ConnectionRefused,
            0x06 => Reply::TtlExpired,
            0x07 => Reply::CommandNotSupported,
            0x08 => Reply::AddressTypeNotSupported,
            _ => Reply::GeneralFailure,
        }
    }

    /// The reply for a failed connect.
    pub fn from_io(e: &std::io::Error) -> Reply {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => Reply::ConnectionRefused,
            K::TimedOut | K::HostUnreachable => Reply::HostUnreachable,
            K::NetworkUnreachable => Reply::NetworkUnreachable,
            _ => Reply::GeneralFailure,
        }
    }
}

/// What a parser makes of the bytes so far: a message and the bytes it took,
/// nothing yet, or an error no further byte can fix.
pub type Parsed<T> = Result<Option<(T, usize)>, ParseError>;

/// `VER NMETHODS METHODS…`
pub fn parse_greeting(buf: &[u8]) -> Parsed<Greeting> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(ParseError::Version(version));
    }
    let Some(&n) = buf.get(1) else {
        return Ok(None);
    };
    if n == 0 {
        return Err(ParseError::NoMethods);
    }
    let end = 2 + usize::from(n);
    let Some(methods) = buf.get(2..end) else {
        return Ok(None);
    };
    Ok(Some((
        Greeting {
            methods: methods.to_vec(),
        },
        end,
    )))
}

/// `VER ULEN UNAME PLEN PASSWD` (RFC 1929).
pub fn parse_credentials(buf: &[u8]) -> Parsed<Credentials> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != USERPASS_VERSION {
        return Err(ParseError::AuthVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(None);
    };
    let user_end = 2 + usize::from(ulen);
    let Some(user) = buf.get(2..user_end) else {
        return Ok(None);
    };
    let Some(&plen) = buf.get(user_end) else {
        return Ok(None);
    };
    let end = user_end + 1 + usize::from(plen);
    let Some(password) = buf.get(user_end + 1..end) else {
        return Ok(None);
    };
    Ok(Some((
        Credentials {
            user: user.to_vec(),
            password: password.to_vec(),
        },
        end,
    )))
}

/// `VER CMD RSV ATYP DST.ADDR DST.PORT`. Any command parses; the caller refuses
/// what it does not support, with the right reply.
pub fn parse_request(buf: &[u8]) -> Parsed<Request> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(ParseError::Version(version));
    }
    let (Some(&command), Some(&reserved), Some(&atyp)) = (buf.get(1), buf.get(2), buf.get(3))
    else {
        return Ok(None);
    };
    if reserved != 0 {
        return Err(ParseError::Reserved(reserved));
    }
    let rest = &buf[4..];
    let (target, used) = match atyp {
        ATYP_V4 => {
            let Some(b) = rest.get(..6) else {
                return Ok(None);
            };
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            let port = u16::from_be_bytes([b[4], b[5]]);
            (Target::Addr(SocketAddrV4::new(ip, port).into()), 6)
        }
        ATYP_V6 => {
            let Some(b) = rest.get(..18) else {
                return Ok(None);
            };
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[..16]);
            let port = u16::from_be_bytes([b[16], b[17]]);
            (
                Target::Addr(SocketAddrV6::new(Ipv6Addr::from(octets), port, 0, 0).into()),
                18,
            )
        }
        ATYP_DOMAIN => {
            let Some(&len) = rest.first() else {
                return Ok(None);
            };
            if len == 0 {
                return Err(ParseError::EmptyDomain);
            }
            let end = 1 + usize::from(len);
            let Some(b) = rest.get(..end + 2) else {
                return Ok(None);
            };
            let name = std::str::from_utf8(&b[1..end]).map_err(|_| ParseError::DomainNotUtf8)?;
            let port = u16::from_be_bytes([b[end], b[end + 1]]);
            (Target::Domain(name.to_owned(), port), end + 2)
        }
        other => return Err(ParseError::AddressType(other)),
    };
    Ok(Some((Request { command, target }, 4 + used)))
}

/// The server's choice of method.
pub fn method_reply(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// The server's verdict on the credentials: 0 lets the client in.
pub fn auth_reply(ok: bool) -> [u8; 2] {
    [USERPASS_VERSION, if ok { 0 } else { 1 }]
}

/// `VER REP RSV ATYP BND.ADDR BND.PORT`.
pub fn reply(code: Reply, bound: SocketAddr) -> Vec<u8> {
    let mut out = vec![VERSION, code as u8, 0];
    match bound {
        SocketAddr::V4(a) => {
            out.push(ATYP_V4);
            out.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out.push(ATYP_V6);
            out.extend_from_slice(&a.ip().octets());
        }
    }
    out.extend_from_slice(&bound.port().to_be_bytes());
    out
}

/// Encodes a request as a client would (for tests and the fuzz target's
/// round trip). `None` for a domain longer than 255 bytes.
pub fn encode_request(request: &Request) -> Option<Vec<u8>> {
    let mut out = vec![VERSION, request.command, 0];
    match &request.target {
        Target::Addr(SocketAddr::V4(a)) => {
            out.push(ATYP_V4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        Target::Addr(SocketAddr::V6(a)) => {
            out.push(ATYP_V6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        Target::Domain(name, port) => {
            out.push(ATYP_DOMAIN);
            out.push(u8::try_from(name.len()).ok()?);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&port.to_be_bytes());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every proper prefix of a complete message asks for more bytes.
    fn prefixes_wait<T: std::fmt::Debug>(msg: &[u8], parse: fn(&[u8]) -> Parsed<T>) {
        for i in 0..msg.len() {
            assert!(
                matches!(parse(&msg[..i]), Ok(None)),
                "prefix of {i} bytes: {:?}",
                parse(&msg[..i])
            );
        }
    }

    #[test]
    fn greeting() {
        let msg = [5, 2, METHOD_NO_AUTH, METHOD_USERPASS, 0xAA];
        let (g, used) = parse_greeting(&msg).expect("valid").expect("complete");
        assert_eq!(used, 4, "the byte after the greeting is not taken");
        assert!(g.offers(METHOD_USERPASS) && g.offers(METHOD_NO_AUTH) && !g.offers(1));
        prefixes_wait(&msg[..4], parse_greeting);
        assert_eq!(parse_greeting(&[4, 1, 0]), Err(ParseError::Version(4)));
        assert_eq!(parse_greeting(&[5, 0]), Err(ParseError::NoMethods));
    }

    #[test]
    fn credentials() {
        let msg = [1, 5, b'a', b'l', b'i', b'c', b'e', 3, b'p', b'w', b'd'];
        let (c, used) = parse_credentials(&msg).expect("valid").expect("complete");
        assert_eq!(
            (c.user.as_slice(), c.password.as_slice()),
            (&b"alice"[..], &b"pwd"[..])
        );
        assert_eq!(used, msg.len());
        prefixes_wait(&msg, parse_credentials);
        let (empty, used) = parse_credentials(&[1, 0, 0])
            .expect("valid")
            .expect("complete");
        assert_eq!((empty.user.len(), empty.password.len(), used), (0, 0, 3));
        assert_eq!(parse_credentials(&[5, 1]), Err(ParseError::AuthVersion(5)));
        assert!(
            !format!("{c:?}").contains("pwd"),
            "passwords stay out of logs"
        );
    }

    #[test]
    fn requests_round_trip() {
        for target in [
            Target::Addr("198.18.0.3:8000".parse().expect("addr")),
            Target::Addr("[2001:db8::1]:443".parse().expect("addr")),
            Target::Domain("c".into(), 8000),
            Target::Domain("x".repeat(255), 1),
        ] {
            let request = Request {
                command: CMD_CONNECT,
                target,
            };
            let mut bytes = encode_request(&request).expect("encodes");
            prefixes_wait(&bytes, parse_request);
            let len = bytes.len();
            bytes.extend_from_slice(b"GET / HTTP/1.1");
            assert_eq!(
                parse_request(&bytes),
                Ok(Some((request.clone(), len))),
                "{request:?}"
            );
        }
        assert!(
            encode_request(&Request {
                command: 1,
                target: Target::Domain("x".repeat(256), 1)
            })
            .is_none()
        );
    }

    #[test]
    fn bad_requests_say_why() {
        assert_eq!(parse_request(&[5, 1, 1, 1]), Err(ParseError::Reserved(1)));
        assert_eq!(
            parse_request(&[5, 1, 0, 9]),
            Err(ParseError::AddressType(9))
        );
        assert_eq!(
            ParseError::AddressType(9).reply(),
            Reply::AddressTypeNotSupported
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 0]),
            Err(ParseError::EmptyDomain)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 1, 0xFF, 0, 80]),
            Err(ParseError::DomainNotUtf8)
        );
        assert_eq!(parse_request(&[4, 1, 0, 1]), Err(ParseError::Version(4)));
    }

    #[test]
    fn replies() {
        assert_eq!(method_reply(METHOD_USERPASS), [5, 2]);
        assert_eq!(auth_reply(true), [1, 0]);
        assert_eq!(auth_reply(false), [1, 1]);
        assert_eq!(
            reply(Reply::Succeeded, "198.18.0.1:40000".parse().expect("addr")),
            [5, 0, 0, 1, 198, 18, 0, 1, 0x9c, 0x40]
        );
        assert_eq!(
            reply(Reply::HostUnreachable, "[::]:0".parse().expect("addr")).len(),
            22
        );
        for code in 0..=9u8 {
            let r = Reply::from_code(code);
            assert!(r as u8 == code || (code == 9 && r == Reply::GeneralFailure));
        }
    }
}
