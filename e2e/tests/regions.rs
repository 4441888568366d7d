//! Regions (issue 17.1) on one machine: `spec.spread` puts the generated nodes
//! of `manifests/examples/wan.yaml` in three regions, `spec.regionLinks` gives
//! the links between regions their WAN delay, and real pings cross them with
//! exactly that delay. A MemberCluster in the manifest runs its nodes here too,
//! saying so, with nothing subtracted from the delays.

use nextmini_e2e::{Env, interfaces_of, namespaces_of, ping_median_ms, repo_path};

#[test]
fn regions_spread_nodes_and_their_links_carry_the_wan_delay() {
    let env = Env::new("regions");
    let wan = repo_path("manifests/examples/wan.yaml");
    env.ok(&["up", "-f", wan.to_str().expect("path")]);

    let placed = env.psql(
        "SELECT string_agg(n.name || '=' || coalesce(n.region, '-') || '/' || coalesce(n.cluster, '-'), ' ' ORDER BY n.idx) \
         FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = 'wan'",
    );
    assert_eq!(
        placed.trim(),
        "n0=eu-west/- n1=eu-west/- n2=eu-west/- n3=us-east/- n4=us-east/- n5=us-east/- n6=ap-south/- n7=ap-south/- n8=ap-south/-",
        "blocks of three, in order; no MemberCluster: regions are labels"
    );

    // Inside eu-west: two links of 1 ms each way.
    let near = ping_median_ms(&env, "n0", "n2", 10);
    assert!(
        (3.9..12.0).contains(&near),
        "n0 -> n2 RTT {near} ms, expected about 4"
    );
    // Across: 6 links of 1 ms, eu-us 20 ms and us-ap 30 ms, each way.
    let far = ping_median_ms(&env, "n0", "n8", 10);
    println!("RTT n0 -> n2 {near:.2} ms (4 asked), n0 -> n8 {far:.2} ms (112 asked)");
    assert!(
        (112.0 * 0.99..112.0 + 15.0).contains(&far),
        "n0 -> n8 RTT {far} ms, expected about 112"
    );
    // The 200 Mbit/s of the eu-us entry reached the link (its own rate field
    // is unset, linkDefaults says 1 Gbit/s).
    let rate = env.psql(
        "SELECT l.params_forward->>'rate_bps' FROM links l JOIN topologies t ON t.id = l.topology_id \
         WHERE t.name = 'wan' AND l.name = 'n2-n3'",
    );
    assert_eq!(rate.trim(), "200000000");
    env.ok(&["down", "wan"]);

    // A member cluster elsewhere: on one machine its node runs here, with a
    // warning, and the whole delay is emulated.
    let file = env.state_dir.join("member.yaml");
    std::fs::write(
        &file,
        "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: far}\nspec:\n  region: us-east\n  kubeconfigSecretRef: {namespace: nextmini, name: far}\nstatus: {rtt: 30ms}\n---\n\
         apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: member}\nspec:\n  nodes: [{name: a}, {name: b, cluster: far}]\n  links: [{endpoints: [a, b], delay: 10ms}]\n",
    )
    .expect("manifest");
    let out = env.run(&["up", "-f", file.to_str().expect("path")]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "up: {said}");
    assert!(
        said.contains("MemberCluster/far"),
        "names the MemberCluster: {said}"
    );
    assert!(said.contains("every node runs on this machine"), "{said}");
    let rtt = ping_median_ms(&env, "a", "b", 10);
    println!("RTT a -> b {rtt:.2} ms (20 asked, nothing subtracted)");
    assert!(
        (19.8..30.0).contains(&rtt),
        "a -> b RTT {rtt} ms: 10 ms each way, nothing subtracted"
    );
    env.ok(&["down", "member"]);

    for t in ["wan", "member"] {
        assert!(namespaces_of(t).is_empty(), "{t}: namespaces left");
        assert!(interfaces_of(t).is_empty(), "{t}: interfaces left");
    }
}
