//! The threads that certify a chain's commits while the chain goes on.
//!
//! A thread spawned for every commit cost more than the commit: each new thread's first
//! allocations take fresh memory, which the kernel zeroes (half of all CPU samples in a linked
//! counters run, `perf`). A chain instead keeps up to as many threads as it may have commits
//! outstanding, made when none is free and reused for its later commits.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Work for a certifying thread: one commit, answered through its slot.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A chain's certifying threads (at most `limit`), fed in order of submission.
pub(super) struct Certifiers {
    queue: Arc<Queue>,
    threads: usize,
    limit: usize,
}

struct Queue {
    state: Mutex<State>,
    ready: Condvar,
}

struct State {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// Set when the chain is gone: the threads end once the jobs are done.
    closed: bool,
}

impl Certifiers {
    /// No thread yet; at most `limit` (at least 1) of them.
    pub(super) fn new(limit: usize) -> Certifiers {
        Certifiers {
            queue: Arc::new(Queue {
                state: Mutex::new(State {
                    jobs: VecDeque::new(),
                    idle: 0,
                    closed: false,
                }),
                ready: Condvar::new(),
            }),
            threads: 0,
            limit: limit.max(1),
        }
    }

    /// Runs `job` on a free thread, on a new one if none is free and the limit allows, or
    /// else on the first to come free. If no thread exists and none can be made, the job
    /// runs here: the caller then waits for the commit, which hides nothing but decides it.
    pub(super) fn submit(&mut self, job: Job) {
        let mut state = self.queue.state.lock();
        state.jobs.push_back(job);
        let start = state.idle < state.jobs.len() && self.threads < self.limit;
        drop(state);
        if start {
            let queue = self.queue.clone();
            let spawned = std::thread::Builder::new()
                .name("atomos-linked".into())
                .spawn(move || queue.serve());
            if spawned.is_ok() {
                self.threads += 1;
                return;
            }
            // No thread could be made: the jobs wait for the threads there are or, with none,
            // this one runs on the caller (a panic in it reaches the caller; its handle is
            // told the outcome is unknown as the job unwinds).
            if self.threads == 0 {
                let job = self.queue.state.lock().jobs.pop_front();
                if let Some(job) = job {
                    job();
                }
                return;
            }
        }
        self.queue.ready.notify_one();
    }
}

impl Queue {
    /// A certifying thread's loop: the next job, until the chain is gone and no job is left.
    fn serve(&self) {
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                // A job that panics has answered already (its answer's sender puts "unknown"
                // as it unwinds); the thread goes on serving.
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                    // Not dropped: a payload whose destructor panics would end the thread.
                    std::mem::forget(payload);
                }
                state = self.state.lock();
                continue;
            }
            if state.closed {
                return;
            }
            state.idle += 1;
            self.ready.wait(&mut state);
            state.idle -= 1;
        }
    }
}

impl Drop for Certifiers {
    fn drop(&mut self) {
        self.queue.state.lock().closed = true;
        self.queue.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// Jobs run concurrently up to the limit, on threads that are kept and reused.
    #[test]
    fn jobs_share_at_most_limit_threads_and_each_runs_once() {
        let mut certifiers = Certifiers::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let names = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let (done_tx, done_rx) = mpsc::channel();
        for _ in 0..50 {
            let (ran, names, done) = (ran.clone(), names.clone(), done_tx.clone());
            certifiers.submit(Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                names.lock().insert(std::thread::current().id());
                done.send(()).unwrap();
            }));
        }
        for _ in 0..50 {
            done_rx.recv().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 50);
        assert!(names.lock().len() <= 2, "{} threads", names.lock().len());
        assert!(certifiers.threads <= 2);
    }

    /// A job that panics leaves its thread serving the next jobs.
    #[test]
    fn a_panicking_job_leaves_its_thread_serving() {
        let mut certifiers = Certifiers::new(1);
        certifiers.submit(Box::new(|| panic!("a job that panics")));
        let (done_tx, done_rx) = mpsc::channel();
        certifiers.submit(Box::new(move || done_tx.send(()).unwrap()));
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the next job ran");
        assert_eq!(certifiers.threads, 1);
    }

    /// Two jobs that wait for each other both run at once with a limit of two.
    #[test]
    fn outstanding_jobs_up_to_the_limit_run_concurrently() {
        let mut certifiers = Certifiers::new(2);
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let done_a = done_tx.clone();
        certifiers.submit(Box::new(move || {
            a_tx.send(()).unwrap();
            b_rx.recv().unwrap();
            done_a.send(()).unwrap();
        }));
        certifiers.submit(Box::new(move || {
            a_rx.recv().unwrap();
            b_tx.send(()).unwrap();
            done_tx.send(()).unwrap();
        }));
        for _ in 0..2 {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("both jobs ran at once");
        }
    }
}
