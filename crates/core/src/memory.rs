//! Process-wide allocator settings for long traced runs.
//!
//! A generation that saves sites keeps every step's values alive, so the buffers of each new
//! call come from fresh memory. glibc's default `malloc` returns large freed blocks to the OS
//! (`munmap`, heap trimming) and takes them back page by page (page faults, zeroing): measured on
//! GPT-2 small, that alone made saving every site cost ~9 % of decode time. Keeping freed memory
//! in the process brings it to ~1 %. So every block comes from the heap: with glibc's largest
//! mapping threshold (32 MiB) blocks past it (a prompt call's logits, `[T, 50257]` floats, from
//! 160 tokens on) still got mappings of their own, faulted in anew at every call; serving them
//! from the heap made prompt calls of 128 and 512 tokens 6-9 % faster.
//!
//! And every block comes from one arena, the main one. A forward call runs on a rayon worker,
//! whose allocations glibc serves from a per-thread arena of 64 MiB heaps; a heap that becomes
//! wholly free is unmapped whatever the trim threshold says, so the buffers of a call saving
//! many sites were faulted in anew at every call: saving every site of a 512-token GPT-2 call
//! cost 1.8-2.0x a plain call, 1.47x with one arena (and plain calls were 5 % faster).
//!
//! And the heap is never trimmed. With a trim threshold (1 GiB until 2026-12-04) glibc trimmed
//! the heap's top down to its pad (128 KiB) once it exceeded the threshold, so a call saving
//! more than that gave all of it back when its values were dropped, and the next such call
//! faulted it in again: a Llama-shaped 8 x 512-token call saving every site (6-7 GB of values)
//! took 12.6-15.0 s against 3.7-4.2 s for a plain call, a quarter of the CPU time zeroing fresh
//! pages in the kernel; never trimmed, 5.1-5.4 s (page faults of the whole run 4.9-6.3 M ->
//! 1.9 M, the peak resident size the same). The price is that the process keeps the memory of
//! its largest call until it exits.

/// Allocations served by a mapping of their own: none (every block comes from the heap).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_MAX: libc::c_int = 0;

/// Arenas glibc may create: one, the main arena, which keeps freed memory as the trim threshold
/// says (other arenas unmap heaps that become free).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: libc::c_int = 1;

/// Free memory at the top of the heap kept before any is returned to the OS: no limit (glibc
/// documents -1 as turning trimming off).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = -1;

/// Tells the C allocator to keep freed memory for reuse instead of returning it to the OS, and
/// returns whether the setting was applied (only glibc is tuned; elsewhere this does nothing).
/// Call it once, early, from a program that runs many traced calls; the `hookscope` binary does.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes glibc's allocation thresholds; every value is within
        // its documented range (-1 included), and it takes the allocator's own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, MMAP_MAX) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                && libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Memory the OS can still give this process without swapping (`MemAvailable` in
/// `/proc/meminfo`), or `None` where that is not known.
pub fn available_bytes() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a job whose estimated memory exceeds what is available; `what` names the job in
/// the error and `hint` (empty or `; ...`) says what to do instead.
pub fn ensure_fits(what: impl FnOnce() -> String, needed: usize, hint: &str) -> crate::Result<()> {
    match available_bytes() {
        Some(available) if needed > available => Err(crate::Error::InsufficientMemory {
            what: what(),
            needed,
            available,
            hint: hint.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn available_memory_is_read_and_huge_jobs_are_refused() {
        assert!(super::available_bytes().is_some_and(|bytes| bytes > 0));
        let refused = super::ensure_fits(|| "a test job".into(), usize::MAX, "").unwrap_err();
        assert!(
            refused.to_string().starts_with("a test job needs about"),
            "{refused}"
        );
        assert!(super::ensure_fits(|| "a small job".into(), 1, "").is_ok());
    }

    #[test]
    fn glibc_accepts_the_settings() {
        assert!(super::keep_freed_memory());
    }
}
