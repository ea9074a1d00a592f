//! Where forward calls run: on rayon's worker threads, beside the kernels' parallel loops.
//!
//! Every matrix product and element-wise kernel splits its work over rayon's pool. Called from
//! a thread outside the pool, each of those loops is injected into the pool while the caller
//! blocks: every product of a decode step then wakes the sleeping workers and the caller anew
//! (about fifty times a step for GPT-2 small), ~15 % of a bf16 decode step. Called from a worker,
//! the loop runs on that worker at once and the others join it as they wake.

/// Runs `work` on one of rayon's worker threads: in place when the calling thread is one, else
/// handed to the pool while the caller waits.
pub fn on_worker<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    match rayon::current_thread_index() {
        Some(_) => work(),
        None => rayon::scope(|_| work()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From a thread outside the pool the work moves onto a worker; on a worker it stays put.
    #[test]
    fn work_runs_on_a_worker_thread() {
        let outside = std::thread::spawn(|| {
            assert_eq!(rayon::current_thread_index(), None);
            on_worker(rayon::current_thread_index)
        });
        assert!(outside.join().unwrap().is_some());
        let inside = rayon::scope(|_| {
            let here = std::thread::current().id();
            on_worker(move || std::thread::current().id() == here)
        });
        assert!(inside);
    }
}
