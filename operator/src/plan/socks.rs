//! Nodes' SOCKS5 servers: checked against each other (two servers cannot share an
//! address), then planned with their passwords hashed.

use super::assemble::Draft;
use super::errors::ValidationErrors;
use super::model::{PlannedSocks, RelayMode, SocksUser, socks_password_sha256};
use crate::api::{SocksMode, SocksSpec};
use std::net::SocketAddr;

/// RFC 1929 carries user names and passwords with a one-byte length.
const MAX_CREDENTIAL: usize = 255;

pub(crate) fn check(draft: &Draft, errors: &mut ValidationErrors) {
    let origin = &draft.doc.origin;
    // (address, field) of every well-formed listen address so far.
    let mut taken: Vec<(SocketAddr, String)> = Vec::new();
    for node in &draft.nodes {
        let prefix = node.field.trim_end_matches(".name");
        for (j, socks) in node.socks.iter().enumerate() {
            let field = format!("{prefix}.socks[{j}]");
            if let Some(addr) = listen(socks, &field, origin, errors) {
                if let Some((_, first)) = taken.iter().find(|(a, _)| clash(*a, addr)) {
                    errors.push(
                        origin,
                        format!("{field}.listen"),
                        format!("{addr} is already used by {first}: every SOCKS server needs an address of its own"),
                    );
                } else {
                    taken.push((addr, format!("{field}.listen")));
                }
            }
            users(socks, &field, origin, errors);
        }
    }
}

fn listen(
    socks: &SocksSpec,
    field: &str,
    origin: &str,
    errors: &mut ValidationErrors,
) -> Option<SocketAddr> {
    match socks.listen.parse::<SocketAddr>() {
        Ok(addr) if addr.port() == 0 => {
            errors.push(
                origin,
                format!("{field}.listen"),
                format!(
                    "{addr} has port 0, which would pick a random port; name the port clients use"
                ),
            );
            None
        }
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(
                origin,
                format!("{field}.listen"),
                format!(
                    "{:?} is not an address and port such as 127.0.0.1:1080 or [::1]:1080",
                    socks.listen
                ),
            );
            None
        }
    }
}

/// Whether two listeners would fight over one port (an unspecified address takes
/// the port on every address of its family).
fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && (a.ip() == b.ip()
            || (a.is_ipv4() == b.is_ipv4() && (a.ip().is_unspecified() || b.ip().is_unspecified())))
}

fn users(socks: &SocksSpec, field: &str, origin: &str, errors: &mut ValidationErrors) {
    for (k, user) in socks.users.iter().enumerate() {
        let field = format!("{field}.users[{k}]");
        for (what, value) in [("name", &user.name), ("password", &user.password)] {
            if value.is_empty() || value.len() > MAX_CREDENTIAL {
                errors.push(
                    origin,
                    format!("{field}.{what}"),
                    format!(
                        "must be 1 to {MAX_CREDENTIAL} bytes (RFC 1929), got {}",
                        value.len()
                    ),
                );
            }
        }
        if let Some(first) = socks.users[..k].iter().position(|u| u.name == user.name) {
            errors.push(
                origin,
                format!("{field}.name"),
                format!(
                    "duplicate user {:?} (also users[{first}] of this server)",
                    user.name
                ),
            );
        }
    }
}

/// The planned server; `None` only for an address validation refused.
pub(crate) fn plan(socks: &SocksSpec) -> Option<PlannedSocks> {
    Some(PlannedSocks {
        listen: socks.listen.parse().ok()?,
        mode: match socks.mode {
            SocksMode::Normal => RelayMode::Normal,
            SocksMode::Max => RelayMode::Max,
        },
        users: socks
            .users
            .iter()
            .map(|u| SocksUser {
                name: u.name.clone(),
                password_sha256: hex::encode(socks_password_sha256(&u.name, &u.password)),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use crate::plan::{RelayMode, parse_manifest, plan_manifest, socks_password_sha256};

    const BASE: &str = "apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: s}
spec:
  nodes:
    - name: a
      socks:
        - {listen: \"127.0.0.1:1080\"}
        - listen: \"127.0.0.1:1081\"
          mode: max
          users: [{name: alice, password: secret}]
    - name: b
";

    fn errors_of(text: &str) -> Vec<String> {
        let m = parse_manifest("s.yaml", text).expect("parses");
        match plan_manifest(&m) {
            Ok(_) => vec![],
            Err(e) => e
                .iter()
                .map(|e| format!("{}: {}", e.field, e.reason))
                .collect(),
        }
    }

    #[test]
    fn plans_servers_with_hashed_passwords() {
        let m = parse_manifest("s.yaml", BASE).expect("parses");
        let plan = plan_manifest(&m).expect("plans").remove(0);
        let a = plan.node("a").expect("a");
        assert_eq!(a.socks.len(), 2);
        assert_eq!(a.socks[0].listen.to_string(), "127.0.0.1:1080");
        assert_eq!(a.socks[0].mode, RelayMode::Normal);
        assert!(a.socks[0].users.is_empty());
        assert_eq!(a.socks[1].mode, RelayMode::Max);
        assert_eq!(a.socks[1].users[0].name, "alice");
        assert_eq!(
            a.socks[1].users[0].password_sha256,
            hex::encode(socks_password_sha256("alice", "secret"))
        );
        assert!(!a.socks[1].users[0].password_sha256.contains("secret"));
        assert!(plan.node("b").expect("b").socks.is_empty());
    }

    #[test]
    fn errors_name_the_field_and_the_reason() {
        let text = BASE.replace("127.0.0.1:1081", "nowhere");
        assert_eq!(
            errors_of(&text),
            [
                "spec.nodes[0].socks[1].listen: \"nowhere\" is not an address and port such as 127.0.0.1:1080 or [::1]:1080"
            ]
        );
        let text = BASE.replace("127.0.0.1:1081", "127.0.0.1:0");
        assert!(
            errors_of(&text)[0].contains("port 0"),
            "{:?}",
            errors_of(&text)
        );
        let text = BASE.replace(
            "    - name: b\n",
            "    - name: b\n      socks: [{listen: \"0.0.0.0:1080\"}]\n",
        );
        assert_eq!(
            errors_of(&text),
            [
                "spec.nodes[1].socks[0].listen: 0.0.0.0:1080 is already used by spec.nodes[0].socks[0].listen: every SOCKS server needs an address of its own"
            ]
        );
        let text = BASE.replace(
            "[{name: alice, password: secret}]",
            "[{name: alice, password: secret}, {name: alice, password: \"\"}]",
        );
        assert_eq!(
            errors_of(&text),
            [
                "spec.nodes[0].socks[1].users[1].password: must be 1 to 255 bytes (RFC 1929), got 0",
                "spec.nodes[0].socks[1].users[1].name: duplicate user \"alice\" (also users[0] of this server)",
            ]
        );
        let text = BASE.replace("mode: max", "mode: turbo");
        let m = parse_manifest("s.yaml", &text);
        assert!(m.is_err(), "an unknown mode is refused when parsing");
    }
}
