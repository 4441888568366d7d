//! What a stored row may hold, from one source: the JSON Schemas derived from the
//! plan's types (`plan::LinkParams`, with the YAML's limits as constants in their
//! attributes). The database applies them to every write a control script makes
//! (migration 0011's `nextmini_json_problem`, fed from the `nextmini_schemas` table
//! that [`install`] fills), and the hub applies the same documents with
//! [`check::problem`] to every row it loads, so a row that bypassed the database
//! (triggers disabled, an older schema) is caught before it reaches an agent.

pub mod check;
mod schema;

pub use check::{Context, problem};
pub use schema::{LINK_PARAMS, documents, link_params};

/// [`link_params`], built once: the hub checks every link row it loads with it.
pub fn link_params_cached() -> &'static serde_json::Value {
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    DOC.get_or_init(link_params)
}

use sqlx::PgPool;

/// Writes this binary's rule documents into `nextmini_schemas`, replacing older ones.
pub async fn install(pool: &PgPool) -> Result<(), sqlx::Error> {
    for (name, doc) in documents() {
        sqlx::query(
            "INSERT INTO nextmini_schemas (name, schema) VALUES ($1, $2::jsonb) \
             ON CONFLICT (name) DO UPDATE SET schema = EXCLUDED.schema, updated_at = now() \
             WHERE nextmini_schemas.schema IS DISTINCT FROM EXCLUDED.schema",
        )
        .bind(name)
        .bind(doc.to_string())
        .execute(pool)
        .await?;
    }
    Ok(())
}
