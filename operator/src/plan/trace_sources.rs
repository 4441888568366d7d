//! Traces kept in ConfigMaps (`trace.configMap`) are read into the trace's
//! `inline` text before planning, so the planner stays pure and sees one kind
//! of trace. A cluster's fetch phase adds the namespace's ConfigMaps to the
//! manifest; in local mode they are ConfigMap documents of the manifest, so one
//! YAML runs in both.

use super::errors::ValidationErrors;
use super::parse::Manifest;
use crate::api::{ConfigMapKey, TraceSpec};
use k8s_openapi::api::core::v1::ConfigMap;

/// Every ConfigMap a trace of the manifest names, without duplicates. (Takes
/// the manifest mutably only to share the walk with `read_config_maps`.)
pub fn referenced(m: &mut Manifest) -> Vec<String> {
    let mut names = Vec::new();
    for_each_trace(m, |_, _, trace| {
        if let Some(c) = &trace.config_map
            && !names.contains(&c.name)
        {
            names.push(c.name.clone());
        }
    });
    names
}

/// Reads each named key into the trace's `inline`, reporting every trace whose
/// ConfigMap or key is missing, or that sets both.
pub fn read_config_maps(m: &mut Manifest, errors: &mut ValidationErrors) {
    let maps = std::mem::take(&mut m.config_maps);
    for_each_trace(m, |origin, path, trace| {
        let Some(source) = trace.config_map.clone() else {
            return;
        };
        let field = format!("{path}.trace");
        if trace.inline.is_some() {
            errors.push(origin, field, "set exactly one of inline, configMap");
            return;
        }
        match lookup(&maps, &source) {
            Ok(text) => trace.inline = Some(text),
            Err(reason) => errors.push(origin, format!("{field}.configMap"), reason),
        }
    });
    m.config_maps = maps;
}

fn lookup(maps: &[super::Doc<ConfigMap>], source: &ConfigMapKey) -> Result<String, String> {
    let Some(map) = maps
        .iter()
        .find(|d| d.object.metadata.name.as_deref() == Some(source.name.as_str()))
    else {
        return Err(format!(
            "no ConfigMap named {} (create it beside the topology, or add it to the manifest)",
            source.name
        ));
    };
    let data = map.object.data.as_ref();
    match data.and_then(|d| d.get(&source.key)) {
        Some(text) => Ok(text.clone()),
        None => {
            let keys: Vec<&str> = data
                .map(|d| d.keys().map(String::as_str).collect())
                .unwrap_or_default();
            Err(format!(
                "ConfigMap {} has no key {} (it has: {})",
                source.name,
                source.key,
                if keys.is_empty() {
                    "none".to_string()
                } else {
                    keys.join(", ")
                }
            ))
        }
    }
}

/// Calls `f(origin, path, trace)` for every trace of every layer of link
/// parameters in the manifest; `path` is the layer's, e.g. `spec.links[0].forward`.
fn for_each_trace(m: &mut Manifest, mut f: impl FnMut(&str, &str, &mut TraceSpec)) {
    for doc in &mut m.topologies {
        let spec = &mut doc.object.spec;
        if let Some(trace) = spec.link_defaults.as_mut().and_then(|d| d.trace.as_mut()) {
            f(&doc.origin, "spec.linkDefaults", trace);
        }
        for (i, region) in spec.region_links.iter_mut().enumerate() {
            if let Some(trace) = region.trace.as_mut() {
                f(&doc.origin, &format!("spec.regionLinks[{i}]"), trace);
            }
        }
        for (i, link) in spec.links.iter_mut().enumerate() {
            let at = format!("spec.links[{i}]");
            if let Some(trace) = link.trace.as_mut() {
                f(&doc.origin, &at, trace);
            }
            for (dir, params) in [
                ("forward", &mut link.forward),
                ("backward", &mut link.backward),
            ] {
                if let Some(trace) = params.as_mut().and_then(|p| p.trace.as_mut()) {
                    f(&doc.origin, &format!("{at}.{dir}"), trace);
                }
            }
        }
    }
    for doc in &mut m.links {
        let spec = &mut doc.object.spec;
        if let Some(trace) = spec.trace.as_mut() {
            f(&doc.origin, "spec", trace);
        }
        for (dir, params) in [
            ("forward", &mut spec.forward),
            ("backward", &mut spec.backward),
        ] {
            if let Some(trace) = params.as_mut().and_then(|p| p.trace.as_mut()) {
                f(&doc.origin, &format!("spec.{dir}"), trace);
            }
        }
    }
}
