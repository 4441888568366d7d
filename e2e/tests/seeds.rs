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

const REPLAYED: &str = "replayed";

/// A lossy link and a synthetic UDP flow over it, starting 3 s after the
/// agents have it (time for the capture to attach), and a timeline that
/// changes the link's delay after the flow.
fn flow_manifest(seed: u64) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {REPLAYED}\nspec:\n  \
         seed: {seed}\n  nodes: [{{name: a}}, {{name: b}}]\n  links:\n    - endpoints: [a, b]\n      \
         forward: {{loss: 5%}}\n  scenario:\n    events: [{{at: 6s, link: a-b, set: {{delay: 1ms}}}}]\n---\napiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata:\n  name: probe\n\
         spec: {{topology: {REPLAYED}, src: a, dst: b, protocol: udp, rate: 8Mbit, size: 1MB, startDelay: 3s}}\n"
    )
}

/// Captures a → b while the flow runs and returns the sequence numbers of
/// the flow's datagrams the link lost (bytes 12..16 of its payload), and how
/// many it captured.
fn flow_losses(env: &Env) -> (BTreeSet<u32>, usize) {
    let file = env.state_dir.join("replay.pcapng");
    let path = file.to_str().expect("path");
    env.ok(&["capture", "a-b", "--duration", "7", "-w", path]);
    let out = std::process::Command::new("tshark")
        .args(["-r", path, "-T", "fields", "-E", "separator=/t"])
        .args(["-e", "udp.payload", "-e", "frame.comment"])
        .output()
        .expect("tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(payload, _)| payload.len() >= 32)
        .collect();
    let lost = rows
        .iter()
        .filter(|(_, comment)| comment.contains("verdict=dropped-loss"))
        .map(|(payload, _)| u32::from_str_radix(&payload[24..32], 16).expect("sequence"))
        .collect();
    (lost, rows.len())
}

#[test]
fn a_recorded_run_comes_up_again_and_loses_the_same_packets_of_a_synthetic_flow() {
    let env = Env::new("replay");
    env.apply_yaml(REPLAYED, &flow_manifest(11));
    let (first, captured) = flow_losses(&env);
    env.wait_for("the timeline's event to take effect", Duration::from_secs(10), || {
        env.psql("SELECT count(*) FROM scenario_timeline WHERE topology = 'replayed' AND first_applied_at IS NOT NULL") == "1"
    });
    let record = env.state_dir.join("replayed.record.yaml");
    let record_path = record.to_str().expect("path");
    env.ok(&["results", REPLAYED, "--record", record_path]);
    let text = std::fs::read_to_string(&record).expect("the record");
    assert!(text.contains("# Seed: 11"), "{text}");
    assert!(
        text.contains("kind: Flow"),
        "the record holds the flow: {text}"
    );
    assert!(
        text.contains("# Timeline (scenario events as they took effect):")
            && text.contains("+6.000 s a-b set: planned "),
        "the record states the timeline: {text}"
    );
    println!("{}", text.lines().take(6).collect::<Vec<_>>().join("\n"));
    env.ok(&["down", REPLAYED]);

    // Brought up again from nothing, from the record alone.
    env.ok(&["up", "-f", record_path]);
    env.wait_for(
        "agents to apply the record",
        Duration::from_secs(10),
        || nextmini_e2e::all_acked(&env, REPLAYED),
    );
    let (again, _) = flow_losses(&env);
    env.ok(&["down", REPLAYED]);

    // The record with another seed loses other datagrams.
    let other_record = env.state_dir.join("replayed.seed12.yaml");
    std::fs::write(&other_record, text.replace("seed: 11", "seed: 12")).expect("edited record");
    env.ok(&["up", "-f", other_record.to_str().expect("path")]);
    env.wait_for(
        "agents to apply the edited record",
        Duration::from_secs(10),
        || nextmini_e2e::all_acked(&env, REPLAYED),
    );
    let (other, _) = flow_losses(&env);
    env.ok(&["down", REPLAYED]);

    println!(
        "synthetic UDP flow, {captured} datagrams captured: seed 11 lost {} ({:?}...), its record lost {}, seed 12 lost {}",
        first.len(),
        first.iter().take(8).collect::<Vec<_>>(),
        again.len(),
        other.len()
    );
    assert!(captured > 500, "only {captured} datagrams captured");
    assert!(first.len() > 10, "5% loss lost only {}", first.len());
    assert_eq!(
        first, again,
        "the record's run must lose the same datagrams"
    );
    assert_ne!(first, other, "another seed must lose other datagrams");
}
