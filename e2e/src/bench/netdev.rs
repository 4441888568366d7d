//! What a network device does with large packets, recorded beside a throughput
//! figure so that a baseline can be checked for fairness: its MTU, the largest
//! GSO/GRO packets it takes, and its segmentation and receive offloads. A
//! kernel chain with GRO on and Nextmini's underlay without it (or the other
//! way round) would compare two different things.
//!
//! Read with `ip -d -j link show` and `ethtool -k` inside the device's
//! namespace, through whatever command enters it (`ip netns exec`, `nextmini
//! exec`).

use serde_json::{Map, Value, json};
use std::process::Command;

/// The offloads that decide how many bytes one packet carries through a hop.
const FEATURES: [&str; 7] = [
    "tx-checksumming",
    "scatter-gather",
    "tcp-segmentation-offload",
    "generic-segmentation-offload",
    "generic-receive-offload",
    "rx-gro-list",
    "rx-udp-gro-forwarding",
];

/// Link attributes kept from `ip -d -j link show`.
const ATTRIBUTES: [&str; 5] = [
    "mtu",
    "gso_max_size",
    "gro_max_size",
    "tso_max_size",
    "qdisc",
];

/// `{"mtu": …, "gso_max_size": …, …, "offloads": {"generic-receive-offload": "off", …}}`
/// for `dev`; `enter(args)` builds the command that runs `args` in its namespace.
pub fn describe(enter: impl Fn(&[&str]) -> Command, dev: &str) -> anyhow::Result<Value> {
    let link = output(enter(&["ip", "-d", "-j", "link", "show", "dev", dev]))?;
    let link: Value = serde_json::from_str(&link)
        .map_err(|e| anyhow::anyhow!("`ip -j link show dev {dev}` printed no JSON: {e}"))?;
    let link = link
        .get(0)
        .ok_or_else(|| anyhow::anyhow!("no device {dev}"))?;
    let mut out: Map<String, Value> = ATTRIBUTES
        .iter()
        .filter_map(|k| link.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let features = output(enter(&["ethtool", "-k", dev]))?;
    out.insert("offloads".into(), json!(parse_features(&features)));
    Ok(Value::Object(out))
}

/// `name: on|off [fixed]` lines of `ethtool -k`, for the names in [`FEATURES`].
fn parse_features(text: &str) -> Map<String, Value> {
    text.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| FEATURES.contains(name))
        .map(|(name, state)| (name.to_string(), json!(state.trim())))
        .collect()
}

/// A sysctl's value in the namespace `enter` runs in (e.g. the congestion
/// control the end-to-end flows get: `net.ipv4.tcp_congestion_control`).
pub fn sysctl(enter: impl Fn(&[&str]) -> Command, key: &str) -> anyhow::Result<String> {
    Ok(output(enter(&["sysctl", "-n", key]))?.trim().to_string())
}

/// `sysctl -w key=value` in the namespace `enter` runs in.
pub fn sysctl_set(enter: impl Fn(&[&str]) -> Command, assignment: &str) -> anyhow::Result<()> {
    output(enter(&["sysctl", "-qw", assignment])).map(drop)
}

/// The MTU in a [`describe`] result.
pub fn mtu(described: &Value) -> Option<u32> {
    described["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
}

fn output(mut cmd: Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("running {cmd:?}: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_keep_their_state_and_fixed_mark() {
        let text = "Features for vr:\nrx-checksumming: on\ntx-checksumming: on\n\ttx-checksum-ipv4: off [fixed]\n\
                    generic-receive-offload: off\nlarge-receive-offload: off [fixed]\nrx-gro-list: off\n";
        let parsed = parse_features(text);
        assert_eq!(parsed["tx-checksumming"], "on");
        assert_eq!(parsed["generic-receive-offload"], "off");
        assert_eq!(parsed["rx-gro-list"], "off");
        assert!(!parsed.contains_key("large-receive-offload"));
        assert!(!parsed.contains_key("tx-checksum-ipv4"));
    }
}
