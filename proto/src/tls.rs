//! mTLS on the control stream, the part both ends must agree on.
//!
//! The control CA (kept in the store) issues the hub a server certificate for
//! [`HUB_SERVER_NAME`] and every node a client certificate whose URI SAN is
//! [`node_identity_uri`]. Agents verify the hub against the CA whatever address
//! they dial (a Unix socket, a Service name, an IP), so the name is fixed. The hub
//! verifies the client chain to the CA and takes the node's identity from the
//! certificate, never from what the agent says.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::sync::Arc;

/// The DNS name in the hub's certificate, verified by every agent.
pub const HUB_SERVER_NAME: &str = "hub.nextmini.internal";

/// Negotiated on both ends; the stream is gRPC, HTTP/2 only.
const ALPN_H2: &[u8] = b"h2";

const IDENTITY_PREFIX: &str = "spiffe://nextmini/";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what}: no PEM certificate in it")]
    NoCertificate { what: String },
    #[error("{what}: {reason}")]
    Pem { what: String, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Who a node certificate speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    pub topology: String,
    pub node: String,
}

impl std::fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topology, self.node)
    }
}

/// The URI SAN of a node's client certificate (SPIFFE-shaped, so other
/// tooling reads it): `spiffe://nextmini/<topology>/<node>`.
pub fn node_identity_uri(topology: &str, node: &str) -> String {
    format!("{IDENTITY_PREFIX}{topology}/{node}")
}

/// The node a certificate was issued to, from its URI SAN; `None` when the
/// certificate does not parse or names no node.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<NodeIdentity> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        x509_parser::extensions::GeneralName::URI(uri) => {
            let rest = uri.strip_prefix(IDENTITY_PREFIX)?;
            // The topology may be `namespace/name`; node names hold no `/`.
            let (topology, node) = rest.rsplit_once('/')?;
            (!topology.is_empty() && !node.is_empty()).then(|| NodeIdentity {
                topology: topology.to_string(),
                node: node.to_string(),
            })
        }
        _ => None,
    })
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: what.to_string(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what: what.to_string(),
        });
    }
    Ok(certs)
}

fn private_key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca_pem, "control CA")? {
        roots.add(cert)?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The agent's side: trusts only the control CA, presents the node's certificate.
pub fn client_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::ClientConfig, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(
            certificates(cert_pem, "node certificate")?,
            private_key(key_pem, "node key")?,
        )?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // The hub resumes no session (see server_config).
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// The hub's side: a client certificate chained to the control CA is required.
pub fn server_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::ServerConfig, TlsError> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
            .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certificates(cert_pem, "hub certificate")?,
            private_key(key_pem, "hub key")?,
        )?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // No session resumption: a control stream lives as long as its agent, and
    // every handshake presents the node's certificate. A ticket cache kept
    // one small allocation per agent handshake that outlived the agent and
    // held its heap page (7 MB of a hub after 1,000 agents left).
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}
