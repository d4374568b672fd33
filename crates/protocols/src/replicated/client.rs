//! The replicated store seen from a node: how a certification, a barrier, an abstract lock, a
//! procedure invocation or a housekeeping request becomes an [`Entry`] to order, and how the
//! store's [`Answer`] becomes a verdict. The node supplies only the ordering, through
//! [`Orderer`] (an encoded entry in, the encoded answer out): it submits bytes and knows
//! nothing of the entries.

use atomos_core::{Certification, Certifier, CertifyError, LockOutcome, Outcome, TxError, Verdict};

use super::entry::{Answer, Entry, LockOwner};

/// How a node has an entry of the replicated store ordered.
pub trait Orderer: Send + Sync {
    /// Has `entry` (an encoded [`Entry`]) ordered and waits for the store's encoded [`Answer`].
    /// Fails with [`CertifyError::Refused`] if it was not ordered and never will be, and with
    /// [`CertifyError::OutcomeUnknown`] if its fate is not known (with the ticket to ask about
    /// it, if there is one).
    fn order(&self, entry: Vec<u8>) -> Result<Vec<u8>, CertifyError>;

    /// Reports what went wrong where nobody waits for an answer (abstract locks left held
    /// until the node's next start).
    fn report(&self, text: String);
}

/// A node's certifier and invoker over the replicated store: requests of all its threads go
/// through one [`Orderer`].
pub struct StoreClient<O> {
    orderer: O,
    /// This node's id and its run (different at each start): with them the engine's family
    /// ids are unique in the cluster.
    node: u64,
    run: u64,
}

impl<O: Orderer> StoreClient<O> {
    /// The client of node `node` in its run `run`, ordering through `orderer`.
    pub fn new(orderer: O, node: u64, run: u64) -> StoreClient<O> {
        StoreClient { orderer, node, run }
    }

    /// Orders `entry` and decodes the store's answer.
    fn order(&self, entry: &Entry) -> Result<Answer, CertifyError> {
        order(&self.orderer, entry)
    }

    /// The cluster-wide identity of this node's transaction family `family`.
    fn owner(&self, family: u64) -> LockOwner {
        LockOwner {
            node: self.node,
            run: self.run,
            family,
        }
    }

    /// Orders procedure `procedure` on encoded `arguments` (the `active` protocol) and returns
    /// the position it ran at and its outcome.
    pub fn invoke(&self, procedure: &str, arguments: Vec<u8>) -> Result<(u64, Outcome), TxError> {
        let entry = Entry::Invoke {
            procedure: procedure.to_string(),
            arguments,
        };
        match self.order(&entry) {
            Ok(Answer::Invoked { position, outcome }) => Ok((position, outcome)),
            Ok(other) => Err(TxError::OutcomeUnknown {
                reason: format!("the replica answered an invocation with {other:?}"),
                ticket: None,
            }),
            Err(CertifyError::OutcomeUnknown { reason, ticket }) => {
                Err(TxError::OutcomeUnknown { reason, ticket })
            }
            Err(CertifyError::Refused(reason)) => Err(TxError::Refused { reason }),
        }
    }

    /// Releases the abstract locks this node's earlier runs held (they died with those runs);
    /// the store refuses later requests of those runs.
    pub fn release_stale_runs(&self) -> Result<(), CertifyError> {
        let entry = Entry::ReleaseStaleRuns {
            node: self.node,
            keep: self.run,
        };
        self.order(&entry).map(|_| ())
    }

    /// The orderer this client orders through.
    pub fn orderer(&self) -> &O {
        &self.orderer
    }
}

impl<O: Orderer> Certifier for StoreClient<O> {
    fn certify(&self, c: Certification) -> Result<Verdict, CertifyError> {
        let entry = Entry::Certify {
            reads: c.reads,
            writes: c.writes,
        };
        match self.order(&entry)? {
            Answer::Committed { version } => Ok(Verdict::Committed { version }),
            Answer::Conflict { .. } => Ok(Verdict::Conflict),
            other => Err(CertifyError::unknown(format!(
                "the replica answered a certification with {other:?}"
            ))),
        }
    }

    fn barrier(&self) -> Result<u64, CertifyError> {
        Ok(self.order(&Entry::Barrier)?.position())
    }

    fn abstract_lock(&self, owner: u64, name: &str) -> Result<LockOutcome, CertifyError> {
        let entry = Entry::LockFor {
            owner: self.owner(owner),
            name: name.to_string(),
        };
        match self.order(&entry)? {
            Answer::Locked { taken: true, .. } => Ok(LockOutcome::Taken),
            Answer::Locked { taken: false, .. } => Ok(LockOutcome::AlreadyHeld),
            Answer::LockHeld { .. } => Ok(LockOutcome::HeldByAnother),
            other => Err(CertifyError::unknown(format!(
                "the replica answered a lock request with {other:?}"
            ))),
        }
    }

    fn release_abstract(&self, owner: u64, names: Vec<String>) {
        let entry = Entry::UnlockFor {
            owner: self.owner(owner),
            names,
        };
        if let Err(e) = self.order(&entry) {
            // Held until this node's next start releases its earlier runs' locks.
            self.orderer
                .report(format!("abstract locks not released: {e}"));
        }
    }
}

/// Orders `entry` through `orderer` and decodes the store's answer.
fn order(orderer: &impl Orderer, entry: &Entry) -> Result<Answer, CertifyError> {
    let bytes = orderer.order(entry.encode())?;
    Answer::decode(&bytes)
        .map_err(|e| CertifyError::unknown(format!("the replica's answer does not decode: {e}")))
}

/// Orders a garbage collection and returns how many unreachable anonymous objects it deleted
/// (on every replica, at the same log position).
pub fn collect(orderer: &impl Orderer) -> Result<u64, CertifyError> {
    match order(orderer, &Entry::Collect)? {
        Answer::Collected { reclaimed, .. } => Ok(reclaimed),
        other => Err(CertifyError::unknown(format!(
            "the replica answered a collection with {other:?}"
        ))),
    }
}

/// Orders a digest carrying `reported` (a digest a replica computed before: its node, the
/// position, the digest; every replica compares it with its own) and returns this replica's
/// digest: (the position, the digest).
pub fn digest(
    orderer: &impl Orderer,
    reported: Option<(u64, u64, u64)>,
) -> Result<(u64, u64), CertifyError> {
    match order(orderer, &Entry::ContentsDigest { reported })? {
        Answer::Digested { position, digest } => Ok((position, digest)),
        other => Err(CertifyError::unknown(format!(
            "the replica answered a digest with {other:?}"
        ))),
    }
}

/// What an entry's encoded answer says of it: `Ok` if it took effect (a commit, a procedure
/// that returned, a lock taken...), or why it did not; `None` if the answer does not decode (the
/// entry ran, but nothing can be said of how).
pub fn took_effect(answer: &[u8]) -> Option<Result<(), String>> {
    let answer = Answer::decode(answer).ok()?;
    Some(match answer {
        Answer::Conflict { .. } => Err("it conflicted with a transaction ordered before it".into()),
        Answer::Invoked {
            outcome: Outcome::Failed(reason),
            ..
        } => Err(reason),
        Answer::Refused { reason, .. } => Err(reason),
        _ => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use atomos_core::Key;
    use std::sync::Mutex;

    /// Records what it is asked to order and answers from a list.
    #[derive(Default)]
    struct Scripted {
        asked: Mutex<Vec<Entry>>,
        answers: Mutex<Vec<Result<Answer, CertifyError>>>,
        reports: Mutex<Vec<String>>,
    }

    impl Orderer for Scripted {
        fn order(&self, entry: Vec<u8>) -> Result<Vec<u8>, CertifyError> {
            self.asked
                .lock()
                .unwrap()
                .push(Entry::decode(&entry).unwrap());
            self.answers.lock().unwrap().remove(0).map(|a| a.encode())
        }

        fn report(&self, text: String) {
            self.reports.lock().unwrap().push(text);
        }
    }

    fn client(answers: Vec<Result<Answer, CertifyError>>) -> StoreClient<Scripted> {
        let orderer = Scripted {
            answers: Mutex::new(answers),
            ..Scripted::default()
        };
        StoreClient::new(orderer, 3, 9)
    }

    #[test]
    fn a_certification_is_ordered_as_its_reads_and_writes_and_the_answer_is_its_verdict() {
        let c = client(vec![
            Ok(Answer::Committed { version: 12 }),
            Ok(Answer::Conflict { position: 13 }),
        ]);
        let cert = || Certification {
            reads: vec![(Key::from("a"), 4)],
            writes: vec![(Key::from("b"), Some(vec![1]))],
        };
        assert_eq!(c.certify(cert()), Ok(Verdict::Committed { version: 12 }));
        assert_eq!(c.certify(cert()), Ok(Verdict::Conflict));
        let asked = c.orderer().asked.lock().unwrap();
        assert_eq!(
            asked[0],
            Entry::Certify {
                reads: cert().reads,
                writes: cert().writes
            }
        );
    }

    #[test]
    fn locks_carry_the_nodes_run_and_an_unreleased_lock_is_reported() {
        let c = client(vec![
            Ok(Answer::Locked {
                position: 1,
                taken: true,
            }),
            Err(CertifyError::unknown("no majority")),
        ]);
        assert_eq!(c.abstract_lock(5, "x"), Ok(LockOutcome::Taken));
        c.release_abstract(5, vec!["x".into()]);
        let owner = LockOwner {
            node: 3,
            run: 9,
            family: 5,
        };
        let asked = c.orderer().asked.lock().unwrap();
        assert_eq!(
            asked[0],
            Entry::LockFor {
                owner,
                name: "x".into()
            }
        );
        let reports = c.orderer().reports.lock().unwrap();
        assert_eq!(reports.len(), 1, "{reports:?}");
    }

    #[test]
    fn an_unexpected_answer_or_bytes_that_do_not_decode_leave_the_outcome_unknown() {
        let c = client(vec![Ok(Answer::Collected {
            position: 2,
            reclaimed: 0,
        })]);
        assert!(matches!(
            c.certify(Certification {
                reads: vec![],
                writes: vec![]
            }),
            Err(CertifyError::OutcomeUnknown { .. })
        ));
        assert_eq!(
            took_effect(b"\xff\xff"),
            None,
            "an answer that does not decode says nothing"
        );
        assert_eq!(
            took_effect(&Answer::Committed { version: 1 }.encode()),
            Some(Ok(()))
        );
        assert!(matches!(
            took_effect(&Answer::Conflict { position: 3 }.encode()),
            Some(Err(_))
        ));
    }
}
