//! The control CA and the credentials it issues.
//!
//! One CA per store (its key lives in PostgreSQL, which agents never reach)
//! signs the hub's server certificate and one client certificate per node. A
//! node's credential is that certificate and key, plus a random token whose
//! SHA-256 the store keeps: the certificate proves which topology and node an
//! agent speaks for, the token that it belongs to the topology as applied now
//! (a topology deleted and applied again under its name gets new tokens, so the
//! old agents' certificates open nothing).

use nextmini_proto::tls::{HUB_SERVER_NAME, node_identity_uri};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("control CA: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0:?} cannot be a certificate's URI: {1}")]
    Uri(String, String),
}

/// File and Secret key names of a node's credential.
pub mod files {
    /// The token (the bare node name, as before certificates existed).
    pub fn token(node: &str) -> String {
        node.to_string()
    }
    pub fn cert(node: &str) -> String {
        format!("{node}.crt")
    }
    pub fn key(node: &str) -> String {
        format!("{node}.key")
    }
    /// The control CA's certificate, beside the nodes' files.
    pub const CA: &str = "ca.crt";
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

pub struct ControlCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ControlCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlCa").finish_non_exhaustive()
    }
}

/// The CA's parameters. The issuer is rebuilt from these and the stored key,
/// so they must stay the same for the CA's lifetime.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "Nextmini control CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl ControlCa {
    pub fn generate() -> Result<ControlCa, PkiError> {
        let key = KeyPair::generate()?;
        let cert = ca_params().self_signed(&key)?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        Ok(ControlCa {
            issuer: Issuer::new(ca_params(), key),
            cert_pem,
            key_pem,
        })
    }

    /// The CA as stored.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ControlCa, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(ControlCa {
            issuer: Issuer::new(ca_params(), key),
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A client certificate naming `topology`/`node` in its URI SAN.
    pub fn issue_node(&self, topology: &str, node: &str) -> Result<Issued, PkiError> {
        let uri = node_identity_uri(topology, node);
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{topology}/{node}"));
        params.subject_alt_names =
            vec![SanType::URI(uri.as_str().try_into().map_err(
                |e: rcgen::Error| PkiError::Uri(uri.clone(), e.to_string()),
            )?)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params)
    }

    /// The hub's server certificate; made afresh at every start.
    pub fn issue_hub(&self) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::new(vec![HUB_SERVER_NAME.to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Nextmini hub");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What one node's agent needs to open its control stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCredential {
    pub token: String,
    pub cert: Issued,
}

impl NodeCredential {
    pub fn issue(ca: &ControlCa, topology: &str, node: &str) -> Result<NodeCredential, PkiError> {
        Ok(NodeCredential {
            token: hex::encode(rand::random::<[u8; 32]>()),
            cert: ca.issue_node(topology, node)?,
        })
    }

    /// What the store keeps of the token.
    pub fn token_sha256(&self) -> String {
        hex::encode(Sha256::digest(self.token.as_bytes()))
    }
}

/// The credentials of some nodes of one topology, and the CA their agents trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub ca_pem: String,
    pub nodes: BTreeMap<String, NodeCredential>,
}

impl Credentials {
    /// New credentials for `nodes`.
    pub fn issue<'a>(
        ca: &ControlCa,
        topology: &str,
        nodes: impl Iterator<Item = &'a String>,
    ) -> Result<Credentials, PkiError> {
        Ok(Credentials {
            ca_pem: ca.cert_pem().to_string(),
            nodes: nodes
                .map(|n| Ok((n.clone(), NodeCredential::issue(ca, topology, n)?)))
                .collect::<Result<_, PkiError>>()?,
        })
    }

    /// SHA-256 of the tokens of `nodes` (those that have a credential).
    pub fn token_hashes<'a>(
        &self,
        nodes: impl Iterator<Item = &'a String>,
    ) -> BTreeMap<String, String> {
        nodes
            .filter_map(|n| Some((n.clone(), self.nodes.get(n)?.token_sha256())))
            .collect()
    }

    /// As files (or Secret keys): per node its token, certificate and key, and
    /// the CA certificate once.
    pub fn files(&self) -> BTreeMap<String, String> {
        let mut files = BTreeMap::from([(files::CA.to_string(), self.ca_pem.clone())]);
        for (node, c) in &self.nodes {
            files.insert(files::token(node), c.token.clone());
            files.insert(files::cert(node), c.cert.cert_pem.clone());
            files.insert(files::key(node), c.cert.key_pem.clone());
        }
        files
    }

    /// Reads back what [`Credentials::files`] wrote, for `nodes`; a node with a
    /// file missing is left out (and gets new credentials from the caller).
    pub fn from_files<'a>(
        files: &BTreeMap<String, String>,
        nodes: impl Iterator<Item = &'a String>,
    ) -> Option<Credentials> {
        let ca_pem = files.get(files::CA)?.clone();
        let nodes = nodes
            .filter_map(|n| {
                Some((
                    n.clone(),
                    NodeCredential {
                        token: files.get(&files::token(n))?.clone(),
                        cert: Issued {
                            cert_pem: files.get(&files::cert(n))?.clone(),
                            key_pem: files.get(&files::key(n))?.clone(),
                        },
                    },
                ))
            })
            .collect();
        Some(Credentials { ca_pem, nodes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nextmini_proto::tls::{NodeIdentity, client_config, identity_of, server_config};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn node_certificates_name_their_node_and_chain_to_the_ca() {
        let ca = ControlCa::generate().expect("ca");
        let issued = ca.issue_node("line3", "b").expect("node");
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("pem");
        assert_eq!(
            identity_of(&der),
            Some(NodeIdentity {
                topology: "line3".into(),
                node: "b".into()
            })
        );
        // A topology of a namespace keeps its namespace in its nodes' identity:
        // team-b's wan/b is not team-a's wan/b.
        let namespaced = ca.issue_node("team-a/wan", "b").expect("node");
        let der = CertificateDer::from_pem_slice(namespaced.cert_pem.as_bytes()).expect("pem");
        assert_eq!(
            identity_of(&der),
            Some(NodeIdentity {
                topology: "team-a/wan".into(),
                node: "b".into()
            })
        );
        let hub = ca.issue_hub().expect("hub");
        let hub_der = CertificateDer::from_pem_slice(hub.cert_pem.as_bytes()).expect("pem");
        assert_eq!(identity_of(&hub_der), None, "the hub is no node");
        // Both ends' configurations accept what the CA issued.
        client_config(
            ca.cert_pem().as_bytes(),
            issued.cert_pem.as_bytes(),
            issued.key_pem.as_bytes(),
        )
        .expect("client config");
        server_config(
            ca.cert_pem().as_bytes(),
            hub.cert_pem.as_bytes(),
            hub.key_pem.as_bytes(),
        )
        .expect("server config");
    }

    #[test]
    fn a_stored_ca_issues_certificates_its_certificate_verifies() {
        let ca = ControlCa::generate().expect("ca");
        let again = ControlCa::from_pem(ca.cert_pem(), ca.key_pem()).expect("reload");
        let issued = again.issue_node("t", "n").expect("issue");
        let leaf = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("pem");
        let root = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("pem");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).expect("root");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        verifier
            .verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
            .expect("a certificate from the reloaded CA verifies against the stored one");
        let other = ControlCa::generate().expect("other ca");
        let stranger = other.issue_node("t", "n").expect("issue");
        let stranger = CertificateDer::from_pem_slice(stranger.cert_pem.as_bytes()).expect("pem");
        assert!(
            verifier
                .verify_client_cert(&stranger, &[], rustls::pki_types::UnixTime::now())
                .is_err(),
            "another CA's certificate must not verify"
        );
    }

    #[test]
    fn credentials_survive_a_round_trip_through_files() {
        let ca = ControlCa::generate().expect("ca");
        let names = ["a".to_string(), "b".to_string()];
        let credentials = Credentials::issue(&ca, "line3", names.iter()).expect("issue");
        let files = credentials.files();
        assert_eq!(files.len(), 1 + 3 * names.len());
        let back = Credentials::from_files(&files, names.iter()).expect("read back");
        assert_eq!(back, credentials);
        let mut partial = files.clone();
        partial.remove(&files::key("b"));
        let back = Credentials::from_files(&partial, names.iter()).expect("read back");
        assert!(back.nodes.contains_key("a") && !back.nodes.contains_key("b"));
    }
}
