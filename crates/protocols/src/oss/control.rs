//! What OSS agrees on through the order layer: each domain's epochs. The order layer's state
//! machine on every node applies the same entries in the same order, so every node sees the
//! same sequence of suspicions and starts; the node acts on each as it is applied.

use std::collections::BTreeMap;

use atomos_order::{Request, StateMachine};
use serde::{Deserialize, Serialize};

use super::config::CommitMode;
use super::write_set::{CommitId, DomainId, Epoch};

/// An entry of the control log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlEntry {
    /// Epoch `epoch` of `domain` made no progress for someone: every node stops counting its
    /// write sets and reports how far it holds them.
    Suspect {
        /// The domain.
        domain: DomainId,
        /// The epoch suspected.
        epoch: Epoch,
    },
    /// Epoch `epoch` of `domain` starts: `sequencer` numbers its commits from `first` on;
    /// every id below `first` is committed, the previous epoch's ids from it on are not.
    /// Applies only as the epoch after the current one, and (but for the first) after a
    /// suspicion of the current one.
    Start {
        /// The domain.
        domain: DomainId,
        /// The new epoch.
        epoch: Epoch,
        /// The node that numbers its commits.
        sequencer: u64,
        /// Its first commit id.
        first: CommitId,
        /// How its commits are numbered (the first epoch's decides for every later one).
        mode: CommitMode,
    },
}

impl ControlEntry {
    /// The entry as a request payload.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }
}

/// A domain's place in its epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainState {
    /// The current epoch (0: none started).
    pub epoch: Epoch,
    /// Its sequencer.
    pub sequencer: u64,
    /// Its first commit id.
    pub first: CommitId,
    /// Whether it was suspected (the next start may come).
    pub suspected: bool,
    /// How its commits are numbered: the same on every node, whatever each was configured
    /// with (the first start's proposer decided).
    pub mode: CommitMode,
}

/// What applying an entry changed, for the node to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlEvent {
    /// The domain's epoch was suspected.
    Suspected {
        /// The domain.
        domain: DomainId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A new epoch started.
    Started {
        /// The domain.
        domain: DomainId,
        /// Its state now.
        state: DomainState,
    },
}

/// The control log's state machine.
#[derive(Debug, Default)]
pub struct Control {
    domains: BTreeMap<DomainId, DomainState>,
    events: Vec<ControlEvent>,
}

impl Control {
    /// No epoch started anywhere.
    pub fn new() -> Control {
        Control::default()
    }

    /// Domain `d`'s state (epoch 0 if none started).
    pub fn domain(&self, d: DomainId) -> DomainState {
        self.domains.get(&d).copied().unwrap_or(DomainState {
            epoch: 0,
            sequencer: 0,
            first: 1,
            suspected: false,
            mode: CommitMode::UltraPeer,
        })
    }

    /// What the entries applied since the last call changed.
    pub fn take_events(&mut self) -> Vec<ControlEvent> {
        std::mem::take(&mut self.events)
    }

    fn apply_entry(&mut self, entry: ControlEntry) -> bool {
        match entry {
            ControlEntry::Suspect { domain, epoch } => {
                let mut state = self.domain(domain);
                if state.epoch != epoch || epoch == 0 || state.suspected {
                    return false;
                }
                state.suspected = true;
                self.domains.insert(domain, state);
                self.events.push(ControlEvent::Suspected { domain, epoch });
                true
            }
            ControlEntry::Start {
                domain,
                epoch,
                sequencer,
                first,
                mode,
            } => {
                let current = self.domain(domain);
                let follows =
                    epoch == current.epoch + 1 && (current.epoch == 0 || current.suspected);
                if !follows || first < current.first {
                    return false;
                }
                let state = DomainState {
                    epoch,
                    sequencer,
                    first,
                    suspected: false,
                    mode: if current.epoch == 0 {
                        mode
                    } else {
                        current.mode
                    },
                };
                self.domains.insert(domain, state);
                self.events.push(ControlEvent::Started { domain, state });
                true
            }
        }
    }
}

impl StateMachine for Control {
    /// Answers `[1]` for an entry that took effect, `[0]` for one that did not (a second
    /// start of the same epoch, a suspicion of an old one, a payload that is no entry).
    fn apply(&mut self, request: &Request) -> Vec<u8> {
        let applied = postcard::from_bytes::<ControlEntry>(&request.payload)
            .map(|e| self.apply_entry(e))
            .unwrap_or(false);
        vec![u8::from(applied)]
    }

    fn snapshot(&self) -> Vec<u8> {
        let domains: Vec<(DomainId, DomainState)> =
            self.domains.iter().map(|(d, s)| (*d, *s)).collect();
        postcard::to_allocvec(&domains).unwrap_or_default()
    }

    fn check_snapshot(&self, data: &[u8]) -> Result<(), String> {
        postcard::from_bytes::<Vec<(DomainId, DomainState)>>(data)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let domains: Vec<(DomainId, DomainState)> =
            postcard::from_bytes(data).map_err(|e| e.to_string())?;
        self.domains = domains.into_iter().collect();
        // The node re-reads every domain's state after a restore.
        for (&domain, &state) in &self.domains {
            self.events.push(ControlEvent::Started { domain, state });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(c: &mut Control, e: ControlEntry) -> bool {
        let r = Request {
            client: 1,
            seq: 1,
            payload: e.encode(),
            deadline_ms: atomos_order::NO_DEADLINE,
        };
        c.apply(&r) == vec![1]
    }

    #[test]
    fn epochs_follow_one_another_through_suspicions_and_the_first_start_wins() {
        let mut c = Control::new();
        // Proposers configured differently: the first start's mode holds.
        let start = |epoch, sequencer, first| ControlEntry::Start {
            domain: 0,
            epoch,
            sequencer,
            first,
            mode: if epoch == 1 {
                CommitMode::CoordinatorToken
            } else {
                CommitMode::UltraPeer
            },
        };
        assert!(!apply(
            &mut c,
            ControlEntry::Suspect {
                domain: 0,
                epoch: 0
            }
        ));
        assert!(apply(&mut c, start(1, 1, 1)));
        assert!(!apply(&mut c, start(1, 2, 1)), "epoch 1 started already");
        assert!(!apply(&mut c, start(2, 2, 5)), "epoch 1 was not suspected");
        assert!(apply(
            &mut c,
            ControlEntry::Suspect {
                domain: 0,
                epoch: 1
            }
        ));
        assert!(!apply(
            &mut c,
            ControlEntry::Suspect {
                domain: 0,
                epoch: 1
            }
        ));
        assert!(apply(&mut c, start(2, 3, 5)));
        assert!(!apply(&mut c, start(3, 1, 9)));
        assert_eq!(c.domain(0).sequencer, 3);
        assert_eq!(c.domain(0).first, 5);
        assert_eq!(c.domain(0).mode, CommitMode::CoordinatorToken);
        assert_eq!(c.domain(7).epoch, 0, "domains are independent");
        assert_eq!(c.take_events().len(), 3);
        let r = Request {
            client: 1,
            seq: 2,
            payload: vec![0xff, 0xff],
            deadline_ms: atomos_order::NO_DEADLINE,
        };
        assert_eq!(c.apply(&r), vec![0], "not an entry");
        // A snapshot restores the same state and tells the node about it.
        let mut d = Control::new();
        d.restore(&c.snapshot()).unwrap();
        assert_eq!(d.domain(0), c.domain(0));
        assert_eq!(d.take_events().len(), 1);
    }
}
