//! Allocator settings for the packet path.
//!
//! With TUN offloads a packet buffer can be 64 KiB. glibc's defaults give freed
//! memory at the top of a thread's heap back to the kernel once 128 KiB are
//! free, so the next buffer faults its pages in again, zeroed: in profiles
//! this cost the agent about a fifth of its time at 4 Gbit/s. Keeping up to
//! `TRIM_THRESHOLD` bytes turns those faults into plain reuse; an idle agent
//! never holds that much.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 64 << 20;
/// Buffers below this come from the heap (and its free lists), not `mmap`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

/// Call once at start, before the runtime spawns threads.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only changes glibc's allocator parameters, with
    // constant, valid values; it takes the allocator's own locks.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}
