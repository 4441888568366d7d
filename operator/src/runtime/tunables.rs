//! glibc's settings for the processes local mode starts (`GLIBC_TUNABLES`).
//!
//! The hub runs without glibc's per-thread cache of freed blocks and with one
//! arena. Each worker thread's cache keeps up to 7 freed blocks of every small
//! size, scattered over the heap, and `malloc_trim` cannot give back a page
//! one of them is in: after a 1,000-node ring's `down` that kept about 4 MB of
//! a 17 MB hub (1.25-1.31x of before its `up`; 1.04-1.12x without the cache).
//! With an arena per thread (up to 8 per core) the few hundred KB the hub
//! still holds after a `down` (heaptrack: 330 KB of connection buffers,
//! statement caches and channel blocks) are spread over every arena's pages;
//! in one they share fewer: 1.02-1.05x in six runs of `large_local` against
//! 1.04-1.11x in four with the default. Neither costs measurable CPU: with
//! 200 agents reporting every 100 ms the hub took 7.1-8.5% of a core with
//! one arena and 7.5-8.0% with the default; with 1,000, 23.5-24.6% without
//! the cache. Agents keep glibc's defaults: their packet path allocates per
//! packet on every thread. The hub's supervisor restarts agents, so what the
//! hub was given is taken out again for them.

pub const VARIABLE: &str = "GLIBC_TUNABLES";
/// The hub's own settings, each as `name=value`.
const HUB: [&str; 2] = ["glibc.malloc.tcache_count=0", "glibc.malloc.arena_max=1"];

fn name_of(tunable: &str) -> &str {
    tunable.split_once('=').map_or(tunable, |(name, _)| name)
}

/// The hub's tunables: the user's, with each of the hub's added unless the
/// user set that tunable themselves.
pub fn for_hub(user: Option<String>) -> String {
    let user = user.unwrap_or_default();
    let mut all: Vec<&str> = user.split(':').filter(|t| !t.is_empty()).collect();
    for ours in HUB {
        if !all.iter().any(|t| name_of(t) == name_of(ours)) {
            all.push(ours);
        }
    }
    all.join(":")
}

/// An agent's tunables, from those of the process starting it: without the
/// hub's settings (None: none at all).
pub fn for_agent(inherited: Option<String>) -> Option<String> {
    let kept: Vec<&str> = inherited
        .as_deref()
        .unwrap_or_default()
        .split(':')
        .filter(|t| !t.is_empty() && !HUB.contains(t))
        .collect();
    (!kept.is_empty()).then(|| kept.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_runs_without_the_cache_in_one_arena_and_agents_do_not_inherit_that() {
        let ours = "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1";
        assert_eq!(for_hub(None), ours);
        assert_eq!(for_hub(Some(String::new())), ours);
        let user = "glibc.malloc.mmap_threshold=65536".to_string();
        let hub = for_hub(Some(user.clone()));
        assert_eq!(hub, format!("{user}:{ours}"));
        assert_eq!(for_agent(Some(hub)), Some(user));
        assert_eq!(for_agent(Some(for_hub(None))), None);
        assert_eq!(
            for_hub(Some("glibc.malloc.tcache_count=3".into())),
            "glibc.malloc.tcache_count=3:glibc.malloc.arena_max=1",
            "the user's own cache setting wins"
        );
        assert_eq!(
            for_hub(Some("glibc.malloc.arena_max=4".into())),
            "glibc.malloc.arena_max=4:glibc.malloc.tcache_count=0",
            "the user's own arena setting wins"
        );
        assert_eq!(for_agent(None), None);
    }
}
