//! Pure validation and planning: YAML text -> `Manifest` -> `Plan`s, plus routing.
//! No I/O, no Kubernetes client; local mode and the controllers share all of it.

mod address;
mod assemble;
mod build;
mod errors;
#[cfg(test)]
pub(crate) mod fixtures;
mod flows;
mod generate;
pub mod model;
mod params;
mod params_check;
mod parse;
mod routes;
mod scenario;
mod sites;
mod socks;
pub mod trace_sources;
mod validate;

#[cfg(test)]
mod effects_tests;
#[cfg(test)]
mod flows_tests;
#[cfg(test)]
mod params_tests;
#[cfg(test)]
mod scenario_tests;
#[cfg(test)]
mod sites_tests;
#[cfg(test)]
mod tests;

pub use errors::{FieldError, ValidationErrors, WHOLE_DOCUMENT};
pub use flows::{WEB_SEARCH_CSV, cdf_mean, parse_csv};
pub use model::*;
pub use parse::{Doc, Manifest, parse_manifest};
pub use routes::{
    HopRun, TO_ITSELF, UNREACHABLE, expand_runs, longest_path, next_hop_runs, next_hops,
    path_links, same_graph, warnings,
};
pub use sites::{Site, Where, uses_sites};
pub use validate::{check_local, dns_label_problem, local_warnings};

/// Validates every Topology in the manifest together with the Links and Flows that name
/// it, and plans the valid ones. All problems of all topologies are reported together;
/// plans come back only when there are none, in manifest order, each with its links and
/// flows sorted by name. Objects are matched by name only: callers reading from a
/// cluster build one manifest per namespace. Nodes are placed in the clusters the
/// manifest's MemberClusters describe (`plan_manifest_here` for one machine).
pub fn plan_manifest(m: &Manifest) -> Result<Vec<Plan>, ValidationErrors> {
    plan_manifest_for(m, Where::Clusters)
}

/// `plan_manifest` for namespace mode: every node runs on this machine, so no real
/// round trip between clusters is subtracted from a link's delay.
pub fn plan_manifest_here(m: &Manifest) -> Result<Vec<Plan>, ValidationErrors> {
    plan_manifest_for(m, Where::OneMachine)
}

fn plan_manifest_for(m: &Manifest, place: Where) -> Result<Vec<Plan>, ValidationErrors> {
    let mut errors = ValidationErrors::default();
    let mut m = m.clone();
    trace_sources::read_config_maps(&mut m, &mut errors);
    let clusters = sites::Clusters::new(&m, place, &mut errors);
    let groups = assemble::group(&m, &mut errors);
    let mut plans = Vec::with_capacity(groups.len());
    for group in &groups {
        let before = errors.len();
        let mut draft = assemble::draft(group, &mut errors);
        sites::place(&mut draft, &clusters, &mut errors);
        validate::check(&draft, &mut errors);
        sites::check_delays(&draft, &clusters, &mut errors);
        if errors.len() == before {
            plans.push(build::plan(&draft, &clusters));
        }
    }
    errors.into_result(plans)
}
