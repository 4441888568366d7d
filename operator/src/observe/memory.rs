//! The process's own memory: what it holds (for logs) and giving back what
//! the allocator keeps after a burst of work.

/// The resident set of this process in bytes, from /proc (0 where unknown).
pub fn process_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page_size())
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096)
}

/// Returns the free memory glibc's allocator holds in its arenas to the
/// system. A no-op with other C libraries, which have no such call.
pub fn return_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; it has
    // no preconditions and takes the arenas' locks itself.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_goes_back_to_the_system() {
        // 64 small blocks per KiB stay in the arenas when freed (above
        // mmap's threshold they would be unmapped on free already).
        let blocks: Vec<Vec<u8>> = (0..200_000).map(|_| vec![1u8; 512]).collect();
        let full = process_rss_bytes();
        drop(blocks);
        return_free_memory();
        let after = process_rss_bytes();
        assert!(full > 0 && after > 0);
        assert!(
            after + 50 * 1024 * 1024 < full,
            "RSS {full} with 100 MB of blocks, {after} after freeing and trimming"
        );
    }
}
