//! A TFA node's settings: its timing in ticks, its choices, and the bugs it can be built with
//! on purpose.

/// Timing of a node, in ticks.
#[derive(Clone, Debug)]
pub struct TfaConfig {
    /// A lock held this long without a decision makes its owner ask the committer.
    pub lease: u64,
    /// A lock whose committer has not answered for this long is released (the committer is
    /// presumed gone), as is an abstract lock whose family's node has not. Must be longer than
    /// any partition the deployment expects to heal.
    pub abandon: u64,
    /// Unanswered requests and unconfirmed decisions are re-sent this often.
    pub resend: u64,
    /// A request unanswered this long fails its transaction (the node is unreachable).
    pub request_timeout: u64,
    /// Redirects followed by one read before it gives up (the object is moving).
    pub max_hops: u32,
    /// A read that finds the object locked asks again after this long ...
    pub busy_delay: u64,
    /// ... this many times, then aborts its transaction.
    pub busy_retries: u32,
    /// A read made for a write ([`TfaNode::read_for_write`](super::TfaNode::read_for_write)) takes the object's commit lock
    /// with its copy: the commit skips that object's lock request, a round trip. The price:
    /// the object is locked, and in doubt if its committer crashes, from that read on rather
    /// than from the commit on; under contention, readers would wait for whole transactions.
    /// So a node takes no locks with reads for `contention_quiet` after one of its
    /// transactions met a lock.
    pub lock_writes_at_read: bool,
    /// How long after meeting a lock a node's reads for writes take no locks.
    pub contention_quiet: u64,
    /// A node asked for an object it does not own passes the request on to the node it
    /// believes owns it, which answers the reader directly (three messages where a redirect
    /// takes four: objects move to their writers, so a reader's cached owner is often stale).
    /// Off, it answers with a redirect and the reader asks again.
    pub forward_reads: bool,
    /// A deliberate defect, for tests that show the simulation catches it.
    #[doc(hidden)]
    pub planted_bug: Option<PlantedBug>,
}

/// Defects the simulation must catch (tests only).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Locks of a restarted committer's transactions are released, keeping the old copies,
    /// instead of dropping the objects as lost (what TFA did before it knew restarts).
    ReleaseInDoubt,
    /// A restarting node ignores its log: its home records are gone (what TFA did before it
    /// kept them).
    ForgetHomeRecords,
    /// An owner answers a read made for a write without taking the lock.
    UnlockedWriteRead,
    /// An owner hands every object a committed transaction locked to the committer, not only
    /// those the decision names (objects read for a write that did not happen included).
    SurrenderUnnamed,
    /// A home frees a family's abstract lock on any release or "no longer runs" from it, even
    /// one sent before a later ask granted the lock again (what TFA did before it numbered
    /// them).
    StaleRelease,
}

impl Default for TfaConfig {
    /// For ticks of 1 ms: lease 0.5 s, abandon 30 s, re-send 0.2 s, request timeout 2 s; a
    /// locked object is asked again on the next tick, three times; reads for writes lock,
    /// except for 0.1 s after a transaction met a lock; reads are forwarded.
    fn default() -> TfaConfig {
        TfaConfig {
            lease: 500,
            abandon: 30_000,
            resend: 200,
            request_timeout: 2_000,
            max_hops: 16,
            busy_delay: 1,
            busy_retries: 3,
            lock_writes_at_read: true,
            contention_quiet: 100,
            forward_reads: true,
            planted_bug: None,
        }
    }
}
