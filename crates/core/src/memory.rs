//! Process-wide allocator settings for long traced runs.
//!
//! A generation that saves sites keeps every step's values alive, so the buffers of each new
//! call come from fresh memory. glibc's default `malloc` returns large freed blocks to the OS
//! (`munmap`, heap trimming) and takes them back page by page (page faults, zeroing): measured on
//! GPT-2 small, that alone made saving every site cost ~9 % of decode time. Keeping freed memory
//! in the process brings it to ~1 %.

/// Largest allocation still served from the heap rather than its own mapping: glibc's ceiling.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// Free memory at the top of the heap kept before any is returned to the OS.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 1 << 30;

/// Tells the C allocator to keep freed memory for reuse instead of returning it to the OS, and
/// returns whether the setting was applied (only glibc is tuned; elsewhere this does nothing).
/// Call it once, early, from a program that runs many traced calls; the `hookscope` binary does.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes glibc's allocation thresholds; both values are within
        // its documented ranges, and it takes the allocator's own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn glibc_accepts_the_settings() {
        assert!(super::keep_freed_memory());
    }
}
