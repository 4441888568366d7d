//! Plans the unit tests of several layers start from.

use super::{Plan, parse_manifest, plan_manifest};

/// `manifests/examples/line3.yaml`, planned.
pub fn line3() -> Plan {
    planned(
        "line3.yaml",
        include_str!("../../../manifests/examples/line3.yaml"),
    )
}

/// A one-topology manifest, planned (a test's own YAML).
pub fn planned(name: &str, text: &str) -> Plan {
    let manifest = parse_manifest(name, text).expect("parses");
    plan_manifest(&manifest).expect("plans").remove(0)
}
