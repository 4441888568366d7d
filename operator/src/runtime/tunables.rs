//! glibc's settings for the processes local mode starts (`GLIBC_TUNABLES`).
//!
//! The hub runs without glibc's per-thread cache of freed blocks. Each worker
//! thread's cache keeps up to 7 freed blocks of every small size, scattered
//! over the heap, and `malloc_trim` cannot give back a page one of them is in:
//! after a 1,000-node ring's `down` that kept about 4 MB of a 17 MB hub
//! (1.25-1.31x of before its `up`; 1.08-1.16x without the cache), for no
//! measurable CPU (the hub at 23.5% and 24.6% of a core with 1,000 agents
//! reporting every 100 ms). Agents keep the cache: their packet path
//! allocates per packet. The hub's supervisor restarts agents, so what the
//! hub was given is taken out again for them.

pub const VARIABLE: &str = "GLIBC_TUNABLES";
const NO_TCACHE: &str = "glibc.malloc.tcache_count=0";

/// The hub's tunables: the user's, with the cache off unless they set it.
pub fn for_hub(user: Option<String>) -> String {
    match user.filter(|u| !u.is_empty()) {
        Some(u) if u.contains("glibc.malloc.tcache_count") => u,
        Some(u) => format!("{u}:{NO_TCACHE}"),
        None => NO_TCACHE.to_string(),
    }
}

/// An agent's tunables, from those of the process starting it: without the
/// hub's setting (None: none at all).
pub fn for_agent(inherited: Option<String>) -> Option<String> {
    let kept: Vec<&str> = inherited
        .as_deref()
        .unwrap_or_default()
        .split(':')
        .filter(|t| !t.is_empty() && *t != NO_TCACHE)
        .collect();
    (!kept.is_empty()).then(|| kept.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_runs_without_the_cache_and_agents_do_not_inherit_that() {
        assert_eq!(for_hub(None), NO_TCACHE);
        let user = "glibc.malloc.arena_max=2".to_string();
        let hub = for_hub(Some(user.clone()));
        assert_eq!(hub, format!("{user}:{NO_TCACHE}"));
        assert_eq!(for_agent(Some(hub)), Some(user));
        assert_eq!(for_agent(Some(for_hub(None))), None);
        assert_eq!(
            for_hub(Some("glibc.malloc.tcache_count=3".into())),
            "glibc.malloc.tcache_count=3",
            "the user's own cache setting wins"
        );
        assert_eq!(for_agent(None), None);
    }
}
