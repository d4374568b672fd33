//! Threads for bulk work beside a node's protocols (a snapshot's encoding, a compacted log's
//! write). They run at a lower scheduling priority: on a busy machine they take what the
//! protocols' threads leave, rather than delaying a leader's heartbeats into an election.

use std::io;
use std::thread::JoinHandle;

/// How much a background thread's nice value is raised. Linux's scheduler then gives it about
/// a tenth of the share of a thread at the default priority when both want the same core.
const NICE: i32 = 10;

/// Runs `work` on a new thread named `name`, at the lower priority (on Linux; elsewhere at the
/// default one).
pub(crate) fn spawn<T: Send + 'static>(
    name: String,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name).spawn(move || {
        lower_priority();
        work()
    })
}

/// Raises the calling thread's nice value by [`NICE`] (best effort: a failure leaves it as is).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: both calls only read their arguments; the id is the calling thread's, and on
    // Linux the nice value is a per-thread attribute.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The calling thread's nice value.
    fn nice() -> i32 {
        // SAFETY: as in `lower_priority`.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_background_thread_runs_at_a_lower_priority_than_its_spawner() {
        let spawner = nice();
        let worker = super::spawn("niced".into(), nice)
            .expect("spawned")
            .join()
            .expect("ran");
        assert_eq!(worker, (spawner + super::NICE).min(19));
        assert_eq!(nice(), spawner, "the spawner keeps its priority");
    }
}
