//! Multi-document YAML -> typed `Topology` / `Link` / `Flow` objects, with errors that
//! name the document and the field path.
//!
//! Each document is read twice: once as a generic YAML value to learn its kind and name
//! (so every later error can say which object it is about), then as the typed object.
//! The typed pass deserializes straight from the YAML text, not from the value, because
//! only then does serde_norway track the field path (`spec.endpoints[1]`) and the line.

use super::errors::{FieldError, ValidationErrors, WHOLE_DOCUMENT};
use crate::api::{API_VERSION, Flow, Link, MemberCluster, Topology};
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;
use serde_norway::{Deserializer, Mapping, Value};

/// A parsed object and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc<T> {
    /// Human-readable origin for error messages, e.g. `line3.yaml document 2 (Link/a-b)`.
    pub origin: String,
    /// The object as parsed.
    pub object: T,
}

/// Every Nextmini object in one or more YAML streams, in document order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    pub topologies: Vec<Doc<Topology>>,
    pub links: Vec<Doc<Link>>,
    pub flows: Vec<Doc<Flow>>,
    /// ConfigMaps that traces may name (`trace.configMap`), as a cluster would
    /// hold them beside the topology.
    pub config_maps: Vec<Doc<ConfigMap>>,
    /// Clusters nodes may be placed in (`spec.nodes[].cluster`, regions).
    pub member_clusters: Vec<Doc<MemberCluster>>,
}

impl Manifest {
    /// Appends the objects of another file (`up -f a.yaml -f b.yaml`).
    pub fn extend(&mut self, other: Manifest) {
        self.topologies.extend(other.topologies);
        self.links.extend(other.links);
        self.flows.extend(other.flows);
        self.config_maps.extend(other.config_maps);
        self.member_clusters.extend(other.member_clusters);
    }
}

const KINDS: &str = "Topology, Link, Flow, MemberCluster (nextmini.io/v1alpha1) or ConfigMap (v1)";
const TOP_LEVEL_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];
const CONFIG_MAP_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "data",
    "binaryData",
    "immutable",
];
/// The core API group's version, ConfigMap's.
const CORE_VERSION: &str = "v1";
/// Fields of `ObjectMeta`; checked by hand because k8s-openapi accepts unknown ones.
const METADATA_FIELDS: &[&str] = &[
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

#[derive(Clone, Copy)]
enum Kind {
    Topology,
    Link,
    Flow,
    MemberCluster,
    ConfigMap,
}

/// Parses a stream of YAML documents. `source` names the stream in errors (usually the
/// file name). Empty documents are skipped; all problems are reported, not just the first.
/// The Kubernetes API refuses objects over about 1.5 MiB (etcd's request
/// limit); local mode holds documents to the same limit, so a manifest that
/// works here also applies to a cluster. Big topologies use `generator`.
pub const MAX_DOCUMENT_BYTES: usize = 1_572_864;

/// Reports documents over the size limit, before any of them is parsed (a YAML
/// parser would otherwise spend its time and memory on them). A document
/// marker is a line starting with `---` at column 0, which YAML allows nowhere else.
fn oversized_documents(source: &str, text: &str, errors: &mut ValidationErrors) {
    let mut index = 1;
    let mut size = 0usize;
    let mut report = |index: usize, size: usize| {
        if size > MAX_DOCUMENT_BYTES {
            errors.push(
                format!("{source} document {index}"),
                WHOLE_DOCUMENT,
                format!(
                    "is {:.1} MiB; documents may be at most 1.5 MiB (the Kubernetes API's limit): describe large topologies with spec.generator and separate Link objects",
                    size as f64 / 1_048_576.0
                ),
            );
        }
    };
    for line in text.split_inclusive('\n') {
        if line.starts_with("---") && size > 0 {
            report(index, size);
            index += 1;
            size = 0;
        }
        size += line.len();
    }
    report(index, size);
}

pub fn parse_manifest(source: &str, text: &str) -> Result<Manifest, ValidationErrors> {
    let mut errors = ValidationErrors::default();
    oversized_documents(source, text, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }

    // Pass 1: generic values. A YAML syntax error desynchronizes the rest of the stream,
    // so stop at the first one (and report it after the documents before it).
    let mut values = Vec::new();
    let mut syntax_error = None;
    for (i, document) in Deserializer::from_str(text).enumerate() {
        match Value::deserialize(document) {
            Ok(value) => values.push(value),
            Err(e) => {
                syntax_error = Some(FieldError::new(
                    format!("{source} document {}", i + 1),
                    WHOLE_DOCUMENT,
                    format!("invalid YAML: {e}"),
                ));
                break;
            }
        }
    }

    // Pass 2: typed objects, for documents whose header made sense.
    let mut manifest = Manifest::default();
    for ((i, document), value) in Deserializer::from_str(text).enumerate().zip(&values) {
        let Some((kind, origin)) = check_header(source, i + 1, value, &mut errors) else {
            continue;
        };
        let result = match kind {
            Kind::Topology => Topology::deserialize(document)
                .map(|object| manifest.topologies.push(Doc { origin, object })),
            Kind::Link => Link::deserialize(document)
                .map(|object| manifest.links.push(Doc { origin, object })),
            Kind::Flow => Flow::deserialize(document)
                .map(|object| manifest.flows.push(Doc { origin, object })),
            Kind::MemberCluster => MemberCluster::deserialize(document)
                .map(|object| manifest.member_clusters.push(Doc { origin, object })),
            Kind::ConfigMap => ConfigMap::deserialize(document)
                .map(|object| manifest.config_maps.push(Doc { origin, object })),
        };
        if let Err(e) = result {
            errors
                .0
                .push(yaml_error(&document_label(source, i + 1, value), &e));
        }
    }
    errors.0.extend(syntax_error);
    errors.into_result(manifest)
}

/// `line3.yaml document 2 (Link/a-b)`, with as much of the kind and name as is known.
fn document_label(source: &str, index: usize, value: &Value) -> String {
    let kind = value.get("kind").and_then(Value::as_str);
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str);
    match (kind, name) {
        (Some(k), Some(n)) => format!("{source} document {index} ({k}/{n})"),
        (Some(k), None) => format!("{source} document {index} ({k})"),
        _ => format!("{source} document {index}"),
    }
}

/// Checks apiVersion, kind, top-level and metadata fields. Returns the kind and the
/// document's label when the typed pass should run; `None` for empty or hopeless documents.
fn check_header(
    source: &str,
    index: usize,
    value: &Value,
    errors: &mut ValidationErrors,
) -> Option<(Kind, String)> {
    let label = document_label(source, index, value);
    let map = match value {
        Value::Null => return None,
        Value::Mapping(map) => map,
        _ => {
            errors.push(
                label,
                WHOLE_DOCUMENT,
                "expected a mapping with apiVersion, kind, metadata and spec",
            );
            return None;
        }
    };
    let before = errors.len();

    let config_map = map.get("kind").and_then(Value::as_str) == Some("ConfigMap");
    let version = if config_map {
        CORE_VERSION
    } else {
        API_VERSION
    };
    match map.get("apiVersion") {
        None => errors.push(&label, "apiVersion", format!("missing; expected {version}")),
        Some(Value::String(v)) if v == version => {}
        Some(other) => errors.push(
            &label,
            "apiVersion",
            format!("unknown apiVersion {}; expected {version}", show(other)),
        ),
    }
    let kind = match map.get("kind") {
        None => {
            errors.push(&label, "kind", format!("missing; expected {KINDS}"));
            None
        }
        Some(Value::String(k)) => match k.as_str() {
            "Topology" => Some(Kind::Topology),
            "Link" => Some(Kind::Link),
            "Flow" => Some(Kind::Flow),
            "MemberCluster" => Some(Kind::MemberCluster),
            "ConfigMap" => Some(Kind::ConfigMap),
            _ => {
                errors.push(
                    &label,
                    "kind",
                    format!("unknown kind {k:?}; expected {KINDS}"),
                );
                None
            }
        },
        Some(other) => {
            errors.push(
                &label,
                "kind",
                format!("unknown kind {}; expected {KINDS}", show(other)),
            );
            None
        }
    };
    let top_level = if config_map {
        CONFIG_MAP_FIELDS
    } else {
        TOP_LEVEL_FIELDS
    };
    unknown_fields(map, "", top_level, &label, errors);

    match map.get("metadata") {
        None => errors.push(
            &label,
            "metadata",
            "missing; every object needs metadata.name",
        ),
        Some(Value::Mapping(meta)) => {
            unknown_fields(meta, "metadata.", METADATA_FIELDS, &label, errors);
            match meta.get("name") {
                None => errors.push(
                    &label,
                    "metadata.name",
                    "missing; every object needs a name",
                ),
                Some(Value::String(n)) if !n.is_empty() => {}
                Some(other) => errors.push(
                    &label,
                    "metadata.name",
                    format!("must be a non-empty string, found {}", show(other)),
                ),
            }
        }
        Some(other) => errors.push(
            &label,
            "metadata",
            format!("must be a mapping, found {}", show(other)),
        ),
    }
    if !config_map && !map.contains_key("spec") {
        errors.push(&label, "spec", "missing");
    }

    // The typed pass would only repeat these problems in a less helpful way.
    if errors.len() > before {
        return None;
    }
    kind.map(|k| (k, label))
}

fn unknown_fields(
    map: &Mapping,
    prefix: &str,
    known: &[&str],
    label: &str,
    errors: &mut ValidationErrors,
) {
    for key in map.keys() {
        let name = match key {
            Value::String(s) => s.clone(),
            other => show(other),
        };
        if !known.contains(&name.as_str()) {
            let expected = known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            errors.push(
                label,
                format!("{prefix}{name}"),
                format!("unknown field `{name}`, expected one of {expected}"),
            );
        }
    }
}

/// A YAML value as a short string for messages.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// Splits serde_norway's `"spec.rate: invalid rate ... at line 7 column 9"` into the field
/// path and the reason, and points unknown/missing-field errors at the field itself.
fn yaml_error(document: &str, error: &serde_norway::Error) -> FieldError {
    let mut message = error.to_string();
    let location = error.location();
    if let Some(loc) = &location {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
    }
    // serde_norway prefixes the path only when it is not the root; a path never contains
    // spaces, while the start of a bare message ("invalid type: ...") does.
    let (path, reason) = match message.split_once(": ") {
        Some((path, reason)) if is_path(path) => (path.to_owned(), reason.to_owned()),
        _ => (String::new(), message.clone()),
    };
    let field = match named_field(&reason) {
        Some(name) if path.is_empty() => name.to_owned(),
        Some(name) if path == name || path.ends_with(&format!(".{name}")) => path,
        Some(name) => format!("{path}.{name}"),
        None if path.is_empty() => WHOLE_DOCUMENT.to_owned(),
        None => path,
    };
    let reason = match location {
        Some(loc) => format!("{reason} (line {}, column {})", loc.line(), loc.column()),
        None => reason,
    };
    FieldError::new(document, field, reason)
}

fn is_path(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-[]?".contains(c))
}

/// The field named by serde's "unknown field `x`" / "missing field `x`" messages.
fn named_field(reason: &str) -> Option<&str> {
    let rest = reason
        .strip_prefix("unknown field `")
        .or_else(|| reason.strip_prefix("missing field `"))?;
    rest.split_once('`').map(|(name, _)| name)
}
