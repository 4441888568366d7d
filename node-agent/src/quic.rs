//! QUIC links (quinn). Every agent of a topology holds the topology's link
//! certificate and key (sent in its snapshot): it serves with them, and as a
//! client trusts exactly that certificate, so only agents of the same topology
//! can complete a link handshake.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Name in the link certificate; peers are verified against it.
pub const SERVER_NAME: &str = "nextmini-link";

#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    #[error("link identity: {0}")]
    Identity(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    // Dead peers are noticed within a few seconds, like a reset TCP link.
    if let Ok(idle) = quinn::IdleTimeout::try_from(Duration::from_secs(5)) {
        t.max_idle_timeout(Some(idle));
    }
    // One stream carries the whole link: give it windows for a few Gbit/s.
    t.stream_receive_window(quinn::VarInt::from_u32(16 << 20));
    t.receive_window(quinn::VarInt::from_u32(32 << 20));
    t.send_window(32 << 20);
    Arc::new(t)
}

/// A UDP endpoint on `listen` that accepts and dials links of one topology.
pub fn endpoint(
    listen: SocketAddr,
    cert_der: &[u8],
    key_der: &[u8],
) -> Result<quinn::Endpoint, QuicError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    if cert_der.is_empty() || key_der.is_empty() {
        return Err(QuicError::Identity(
            "the snapshot carries no link certificate".into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert = CertificateDer::from(cert_der.to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec()));

    let server_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicError::Identity(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .map_err(|e| QuicError::Identity(e.to_string()))?;
    let server_crypto = quinn::crypto::rustls::QuicServerConfig::try_from(server_tls)
        .map_err(|e| QuicError::Identity(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport());

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(cert)
        .map_err(|e| QuicError::Identity(e.to_string()))?;
    let client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicError::Identity(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client_crypto = quinn::crypto::rustls::QuicClientConfig::try_from(client_tls)
        .map_err(|e| QuicError::Identity(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
    client.transport_config(transport());

    let mut endpoint = quinn::Endpoint::server(server, listen)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}
