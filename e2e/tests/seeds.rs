//! The experiment's seed (`spec.seed`, issue 18.4) on live traffic: a link that
//! loses 5% of its packets, 3,000 numbered UDP datagrams sent through it, and
//! the numbers that did not arrive. Two runs with the same seed, each brought
//! up from nothing, lose the same datagrams; a run with another seed loses
//! others.

use nextmini_e2e::Env;
use nextmini_e2e::udp_sink::UdpSink;
use std::collections::BTreeSet;
use std::time::Duration;

const TOPOLOGY: &str = "seeded";
const DATAGRAMS: u32 = 3000;

fn manifest(seed: u64) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         seed: {seed}\n  nodes: [{{name: a}}, {{name: b}}]\n  links:\n    - endpoints: [a, b]\n      \
         forward: {{loss: 5%}}\n"
    )
}

/// Sends argv[2] datagrams numbered from 0 to argv[1]:9000, paced so that no
/// queue on the way overflows (only the emulated loss may drop one).
const SENDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(b"%08d" % i + b"x" * 200, (sys.argv[1], 9000))
    if i % 50 == 49:
        time.sleep(0.005)
"#;

/// Brings the topology up from nothing with `seed`, sends the datagrams and
/// returns the numbers that were lost.
fn lost_with(seed: u64) -> BTreeSet<u32> {
    let mut env = Env::new("seeds");
    env.apply_yaml(TOPOLOGY, &manifest(seed));
    let sink = UdpSink::start(&mut env, "b", 9000, Duration::from_secs(2));
    let count = DATAGRAMS.to_string();
    let sent = env.exec("a", &["python3", "-c", SENDER, "b", &count]);
    assert!(
        sent.status.success(),
        "sender: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let received: BTreeSet<u32> = sink
        .arrivals(&env, Duration::from_secs(20))
        .iter()
        .filter_map(|a| a.seq)
        .collect();
    env.ok(&["down", TOPOLOGY]);
    (0..DATAGRAMS).filter(|i| !received.contains(i)).collect()
}

#[test]
fn the_same_seed_loses_the_same_packets() {
    let first = lost_with(7);
    let again = lost_with(7);
    let other = lost_with(8);
    println!(
        "lost with seed 7: {} and {} ({} in common), with seed 8: {}",
        first.len(),
        again.len(),
        first.intersection(&again).count(),
        other.len()
    );
    let share = first.len() as f64 / f64::from(DATAGRAMS);
    assert!(
        (0.03..0.07).contains(&share),
        "5% loss lost {:.2}% of the datagrams",
        share * 100.0
    );
    assert_eq!(first, again, "the same seed lost other datagrams");
    let common = first.intersection(&other).count();
    assert!(
        common * 4 < first.len(),
        "seed 8 lost {common} of the same {} datagrams as seed 7",
        first.len()
    );
}
