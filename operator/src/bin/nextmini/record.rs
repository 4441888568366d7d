//! `nextmini results TOPOLOGY --record FILE`: what a run was made of, as a
//! manifest that brings it up again (`nextmini up -f FILE`). It holds the
//! topology's documents as they were applied (its Links, Flows and the
//! ConfigMaps its traces read included), with the experiment's seed and the
//! timeline of scenario events stated in its header.

use anyhow::{Context, bail};
use nextmini_operator::plan::{self, Manifest};
use nextmini_operator::store::Store;
use serde::Serialize;
use sqlx::Row;
use std::fmt::Write;
use std::path::Path;

pub async fn write(store: &Store, topology: &str, file: &Path) -> anyhow::Result<()> {
    let Some(source) = store.source_of(topology).await? else {
        bail!("no topology named {topology}");
    };
    let Some((plan, _)) = store.load_plan(topology).await? else {
        bail!("no topology named {topology}");
    };
    let documents = documents_of(&source, topology)?;
    let mut text = format!(
        "# nextmini run record of topology {topology}, written by nextmini {}.\n",
        env!("CARGO_PKG_VERSION")
    );
    match plan.seed {
        Some(seed) => writeln!(text, "# Seed: {seed} (spec.seed below).")?,
        None => writeln!(
            text,
            "# Seed: none set; every stream derives from the names alone, so a run of this record draws the same."
        )?,
    }
    let timeline = timeline(store, topology).await?;
    if timeline.is_empty() {
        writeln!(text, "# Timeline: no scenario events ran.")?;
    } else {
        writeln!(text, "# Timeline (scenario events as they took effect):")?;
        for line in timeline {
            writeln!(text, "#   {line}")?;
        }
    }
    writeln!(
        text,
        "# Bring the run up again: nextmini up -f {}",
        file.display()
    )?;
    text.push_str(&documents);
    std::fs::write(file, text).with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}

/// The documents of `topology` in the stored source: the text itself when it
/// holds nothing else (comments kept), else the topology's objects alone.
fn documents_of(source: &str, topology: &str) -> anyhow::Result<String> {
    let manifest = plan::parse_manifest("stored source", source)
        .map_err(|e| anyhow::anyhow!("the stored manifest no longer parses:\n{e}"))?;
    let others = manifest
        .topologies
        .iter()
        .any(|d| d.object.metadata.name.as_deref() != Some(topology));
    if !others {
        return Ok(format!("---\n{}", source.trim_start_matches("---\n")));
    }
    let own = own_objects(manifest, topology);
    let mut out = String::new();
    push_all(&mut out, &own.topologies)?;
    push_all(&mut out, &own.links)?;
    push_all(&mut out, &own.flows)?;
    push_all(&mut out, &own.config_maps)?;
    push_all(&mut out, &own.member_clusters)?;
    Ok(out)
}

/// The topology, the Links and Flows that name it, and the ConfigMaps its traces read.
fn own_objects(mut m: Manifest, topology: &str) -> Manifest {
    m.topologies
        .retain(|d| d.object.metadata.name.as_deref() == Some(topology));
    m.links.retain(|d| d.object.spec.topology == topology);
    m.flows.retain(|d| d.object.spec.topology == topology);
    let mut own = Manifest {
        topologies: m.topologies,
        links: m.links,
        flows: m.flows,
        config_maps: Vec::new(),
        // Any node may name any of them.
        member_clusters: m.member_clusters,
    };
    let read = plan::trace_sources::referenced(&mut own);
    own.config_maps = m
        .config_maps
        .into_iter()
        .filter(|d| {
            d.object
                .metadata
                .name
                .as_ref()
                .is_some_and(|n| read.contains(n))
        })
        .collect();
    own
}

fn push_all<T: Serialize>(out: &mut String, docs: &[plan::Doc<T>]) -> anyhow::Result<()> {
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&d.object).context("writing a document")?);
    }
    Ok(())
}

/// The scenario events of the topology's run, one line each: offset, target,
/// kind, when it was planned and took effect, and its worst skew.
async fn timeline(store: &Store, topology: &str) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query(
        "SELECT at_us, target, kind, planned_at::text AS planned, \
                first_applied_at::text AS applied, worst_skew_us, errors \
         FROM scenario_timeline WHERE topology = $1 ORDER BY idx",
    )
    .bind(topology)
    .fetch_all(store.pool())
    .await
    .context("reading the scenario's timeline")?;
    Ok(rows
        .iter()
        .map(|r| {
            let at_us: i64 = r.get("at_us");
            let applied: Option<String> = r.get("applied");
            let skew: Option<i64> = r.get("worst_skew_us");
            let errors: String = r.get("errors");
            format!(
                "+{:.3} s {} {}: planned {}, applied {}{}{}",
                at_us as f64 / 1e6,
                r.get::<String, _>("target"),
                r.get::<String, _>("kind"),
                r.get::<Option<String>, _>("planned")
                    .unwrap_or_else(|| "(not started)".into()),
                applied.unwrap_or_else(|| "(not yet)".into()),
                skew.map(|s| format!(", worst skew {s} µs"))
                    .unwrap_or_default(),
                if errors.is_empty() {
                    String::new()
                } else {
                    format!(", errors: {errors}")
                }
            )
        })
        .collect())
}
