//! Plans the unit tests of several layers start from.

use super::{Plan, parse_manifest, plan_manifest};

/// `manifests/examples/line3.yaml`, planned.
pub fn line3() -> Plan {
    let text = include_str!("../../../manifests/examples/line3.yaml");
    let manifest = parse_manifest("line3.yaml", text).expect("parses");
    plan_manifest(&manifest).expect("plans").remove(0)
}

/// A one-topology manifest, planned (a test's own YAML).
pub fn planned(name: &str, text: &str) -> Plan {
    let manifest = parse_manifest(name, text).expect("parses");
    plan_manifest(&manifest).expect("plans").remove(0)
}
