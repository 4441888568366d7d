//! The per-topology link identity (a self-signed certificate and its key).

use super::Result;
use sqlx::{PgPool, Row};

/// Certificate and PKCS#8 key, DER-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkIdentity {
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for LinkIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("LinkIdentity")
            .field("cert_der_len", &self.cert_der.len())
            .finish_non_exhaustive()
    }
}

/// The name agents verify in each other's certificates.
pub const LINK_SERVER_NAME: &str = "nextmini-link";

pub fn generate() -> std::result::Result<LinkIdentity, rcgen::Error> {
    let certified = rcgen::generate_simple_self_signed(vec![LINK_SERVER_NAME.to_string()])?;
    Ok(LinkIdentity {
        cert_der: certified.cert.der().to_vec(),
        key_der: certified.signing_key.serialize_der(),
    })
}

/// Sets the topology's identity unless it has one; returns the one in force.
pub(super) async fn ensure(
    pool: &PgPool,
    topology: &str,
    fresh: &LinkIdentity,
) -> Result<Option<LinkIdentity>> {
    sqlx::query(
        "UPDATE topologies SET link_cert_der = $2, link_key_der = $3 \
         WHERE key = $1 AND link_cert_der IS NULL",
    )
    .bind(topology)
    .bind(&fresh.cert_der)
    .bind(&fresh.key_der)
    .execute(pool)
    .await?;
    load(pool, topology).await
}

pub(super) async fn load(pool: &PgPool, topology: &str) -> Result<Option<LinkIdentity>> {
    let row = sqlx::query("SELECT link_cert_der, link_key_der FROM topologies WHERE key = $1")
        .bind(topology)
        .fetch_optional(pool)
        .await?;
    Ok(row.and_then(|r| {
        let cert: Option<Vec<u8>> = r.get("link_cert_der");
        let key: Option<Vec<u8>> = r.get("link_key_der");
        Some(LinkIdentity {
            cert_der: cert?,
            key_der: key?,
        })
    }))
}
