//! One domain's write sets on one node: received in any order, persisted, counted towards the
//! held watermark once durable, stable once a majority holds them, handed out for applying in
//! commit-id order up to the stable point, kept a while for others who missed them.
//!
//! Epochs: commit ids from an epoch's first id on belong to that epoch's sequencer. When a
//! domain is suspected the node stops counting (it reports its held watermark and holds no
//! more); the next epoch's start decides that every id below its first was committed (whoever
//! lacks one fetches it) and that the old epoch's ids from it on never were.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::write_set::{CommitId, Epoch, TxId, WriteSet};

/// What became of an offered write set.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// New: persist it as write number `write`, then it counts once that write is durable.
    Persist,
    /// Already here (or applied): nothing to do.
    Duplicate,
    /// Not of the epoch that owns its commit id, or the domain is between epochs.
    Refused,
}

/// A received write set and the write that persists it.
#[derive(Debug)]
struct Received {
    ws: Arc<WriteSet>,
    write: u64,
}

/// One domain's log on one node.
#[derive(Debug)]
pub struct DomainLog {
    majority: usize,
    /// The current epoch (0: none started yet).
    epoch: Epoch,
    /// Whether write sets of the current epoch are taken (false before a start, after a fence).
    counting: bool,
    /// First commit id of each epoch started, by that id: the owner of an id is the epoch of
    /// the largest first id at or below it.
    owners: BTreeMap<CommitId, Epoch>,
    /// Every id below this was decided committed by an epoch start.
    decided: CommitId,
    /// Received and not yet applied, by commit id.
    received: BTreeMap<CommitId, Received>,
    /// Writes durable through this number.
    durable: u64,
    /// Every id through this is received and durable here.
    held: CommitId,
    /// Each other member's latest reported held watermark in the current epoch.
    peers: BTreeMap<u64, CommitId>,
    /// Every id through this is held by a majority.
    stable: CommitId,
    /// Every id through this was handed out for applying.
    applied: CommitId,
    /// Ids through this exist in the current epoch (see [`DomainLog::expect`]).
    expected: CommitId,
    /// The latest applied write sets, for others who missed them.
    history: VecDeque<Arc<WriteSet>>,
    history_max: usize,
    /// The latest commits applied of each node, by node: a node that catches up from an
    /// image learns from them which of its own commits the image holds.
    recent: BTreeMap<u64, VecDeque<(TxId, CommitId)>>,
}

/// The most commits of one node [`DomainLog::recent`] keeps.
pub const RECENT_PER_NODE: usize = 1024;

impl DomainLog {
    /// The log of a domain among `members` nodes (this one included), keeping up to
    /// `history_max` applied write sets for others.
    pub fn new(members: usize, history_max: usize) -> DomainLog {
        DomainLog {
            majority: members / 2 + 1,
            epoch: 0,
            counting: false,
            owners: BTreeMap::new(),
            decided: 1,
            received: BTreeMap::new(),
            durable: 0,
            held: 0,
            peers: BTreeMap::new(),
            stable: 0,
            applied: 0,
            expected: 0,
            history: VecDeque::new(),
            history_max,
            recent: BTreeMap::new(),
        }
    }

    /// The current epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether the current epoch's write sets are taken.
    pub fn counting(&self) -> bool {
        self.counting
    }

    /// The held watermark: every id through it is durable here.
    pub fn held(&self) -> CommitId {
        self.held
    }

    /// The stable point: every id through it is committed.
    pub fn stable(&self) -> CommitId {
        self.stable
    }

    /// Every id through this was handed out for applying.
    pub fn applied(&self) -> CommitId {
        self.applied
    }

    /// The highest id received (0 if none is waiting).
    pub fn highest_received(&self) -> CommitId {
        self.received
            .last_key_value()
            .map_or(self.applied, |(c, _)| *c)
    }

    /// Every id through this is here, applied or received (durable or not): a token holder
    /// numbering from the id after it validates against every commit before.
    pub fn received_through(&self) -> CommitId {
        let mut through = self.applied;
        while self.received.contains_key(&(through + 1)) {
            through += 1;
        }
        through
    }

    /// Ids through `cid` exist in the current epoch (a token numbered after them arrived):
    /// [`DomainLog::missing`] counts them until they are here.
    pub fn expect(&mut self, cid: CommitId) {
        self.expected = self.expected.max(cid);
    }

    /// The epoch that owns commit id `cid` (0 if none does yet).
    fn owner(&self, cid: CommitId) -> Epoch {
        self.owners.range(..=cid).next_back().map_or(0, |(_, e)| *e)
    }

    /// Takes write set `ws`, to be persisted as write number `write` (the caller emits that
    /// write when the answer is [`Offer::Persist`]).
    pub fn offer(&mut self, ws: WriteSet, write: u64) -> Offer {
        let cid = ws.cid;
        if cid <= self.applied || self.received.contains_key(&cid) {
            return Offer::Duplicate;
        }
        let owner = self.owner(cid);
        let current = cid
            >= self
                .owners
                .last_key_value()
                .map_or(CommitId::MAX, |(f, _)| *f);
        if owner == 0 || ws.epoch != owner || (current && !self.counting && cid >= self.decided) {
            return Offer::Refused;
        }
        self.received.insert(
            cid,
            Received {
                ws: Arc::new(ws),
                write,
            },
        );
        Offer::Persist
    }

    /// Writes through number `through` are durable; returns whether the held watermark moved
    /// (then tell the others).
    pub fn durable(&mut self, through: u64) -> bool {
        self.durable = self.durable.max(through);
        let before = self.held;
        while let Some(r) = self.received.get(&(self.held + 1)) {
            if r.write > self.durable {
                break;
            }
            self.held += 1;
        }
        if self.held != before {
            self.restabilize();
        }
        self.held != before
    }

    /// Member `node` holds every id of `epoch` through `held`.
    pub fn peer_held(&mut self, node: u64, epoch: Epoch, held: CommitId) {
        if epoch != self.epoch || !self.counting {
            return;
        }
        let e = self.peers.entry(node).or_default();
        *e = (*e).max(held);
        self.restabilize();
    }

    fn restabilize(&mut self) {
        let mut marks: Vec<CommitId> = self.peers.values().copied().collect();
        if self.counting {
            marks.push(self.held);
        }
        marks.sort_unstable_by(|a, b| b.cmp(a));
        let majority_holds = marks.get(self.majority - 1).copied().unwrap_or(0);
        // Ids an epoch start decided are committed, but count as stable (installed and
        // acknowledged) only once a majority holds them too: the reporter that had them may
        // be the only one, and lose its disk.
        self.stable = self.stable.max(majority_holds);
    }

    /// The write sets now committed and durable here, in commit-id order, each handed out
    /// once. (Only what is durable here: what a node installed, its log replays.)
    pub fn take_applicable(&mut self) -> Vec<Arc<WriteSet>> {
        let mut out = Vec::new();
        while self.applied < self.stable.min(self.held) {
            let Some(r) = self.received.remove(&(self.applied + 1)) else {
                break;
            };
            self.applied += 1;
            self.history.push_back(r.ws.clone());
            if self.history.len() > self.history_max {
                self.history.pop_front();
            }
            let mine = self.recent.entry(r.ws.tx.node).or_default();
            mine.push_back((r.ws.tx, r.ws.cid));
            if mine.len() > RECENT_PER_NODE {
                mine.pop_front();
            }
            out.push(r.ws);
        }
        out
    }

    /// The ids this node lacks below what it knows exists (received above them, or held by
    /// others, or decided), as inclusive ranges; the caller asks others for them after a
    /// timeout.
    pub fn missing(&self) -> Vec<(CommitId, CommitId)> {
        let known = self
            .highest_received()
            .max(self.peers.values().copied().max().unwrap_or(0))
            .max(self.decided.saturating_sub(1))
            .max(self.expected);
        let mut gaps = Vec::new();
        let mut next = self.applied + 1;
        for &cid in self.received.keys() {
            if cid > next {
                gaps.push((next, cid - 1));
            }
            next = cid + 1;
        }
        if next <= known {
            gaps.push((next, known));
        }
        gaps
    }

    /// The applied write sets in `from..=to` this node still keeps.
    pub fn history(&self, from: CommitId, to: CommitId) -> Vec<Arc<WriteSet>> {
        self.history
            .iter()
            .filter(|ws| ws.cid >= from && ws.cid <= to)
            .cloned()
            .collect()
    }

    /// Whether this node applied `cid` and no longer keeps its write set: a node that lacks it
    /// catches up from an image of the domain instead.
    pub fn forgot(&self, cid: CommitId) -> bool {
        cid <= self.applied && self.history.front().is_none_or(|ws| ws.cid > cid)
    }

    /// The latest commits applied of every node (at most [`RECENT_PER_NODE`] each), oldest
    /// first per node.
    pub fn recent(&self) -> Vec<(TxId, CommitId)> {
        self.recent.values().flatten().copied().collect()
    }

    /// Every id through `through` is applied here from an image of the domain (durable on
    /// this disk) that another node took there, with `recent` its latest commits of every
    /// node: write sets received through it are dropped, the ids count as held and stable,
    /// and the history (which no longer runs without a gap) starts over. Ignored unless it
    /// is ahead of what is applied here; returns whether it was taken.
    pub fn install_image(&mut self, through: CommitId, recent: &[(TxId, CommitId)]) -> bool {
        if through <= self.applied || through == CommitId::MAX {
            return false;
        }
        self.received = self.received.split_off(&(through + 1));
        self.applied = through;
        self.held = self.held.max(through);
        self.stable = self.stable.max(through);
        self.history.clear();
        self.recent.clear();
        for &(tx, cid) in recent {
            let mine = self.recent.entry(tx.node).or_default();
            mine.push_back((tx, cid));
            if mine.len() > RECENT_PER_NODE {
                mine.pop_front();
            }
        }
        // What was received after the image and is durable counts on from it.
        self.durable(self.durable);
        true
    }

    /// Replay: every id through `through` was stable before the restart (a node only ever
    /// applied stable ones).
    pub fn was_stable(&mut self, through: CommitId) {
        self.stable = self.stable.max(through);
    }

    /// Every write set in `from..=to` this node has, applied or not (for a node that lacks
    /// them).
    pub fn known(&self, from: CommitId, to: CommitId) -> Vec<Arc<WriteSet>> {
        let mut out = self.history(from, to);
        out.extend(self.received.range(from..=to).map(|(_, r)| r.ws.clone()));
        out
    }

    /// The write sets received and not applied yet, in commit-id order.
    pub fn unapplied(&self) -> impl Iterator<Item = &WriteSet> {
        self.received.values().map(|r| &*r.ws)
    }

    /// The domain is suspected in `epoch`: stop counting and return what to report: the held
    /// watermark, or the last id an earlier start decided if that is higher (a node that has
    /// not fetched every decided write set yet still knows they are committed, so the next
    /// epoch never starts below them). `None` if the node is in another epoch.
    pub fn fence(&mut self, epoch: Epoch) -> Option<CommitId> {
        if epoch != self.epoch {
            return None;
        }
        self.counting = false;
        Some(self.held.max(self.decided - 1))
    }

    /// Epoch `epoch` starts with first id `first`: every id below it is committed, the
    /// current epoch's ids from it on never were. Returns the transactions of the write sets
    /// dropped here (their commits failed). Ignored (empty) unless `epoch` is the next one.
    pub fn start(&mut self, epoch: Epoch, first: CommitId) -> Vec<TxId> {
        if epoch != self.epoch + 1 {
            return Vec::new();
        }
        let dropped: Vec<TxId> = self
            .received
            .split_off(&first)
            .into_values()
            .map(|r| r.ws.tx)
            .collect();
        self.owners.retain(|&f, _| f < first);
        self.owners.insert(first, epoch);
        self.epoch = epoch;
        self.counting = true;
        self.decided = self.decided.max(first);
        // What is installed here was committed (a node that lost its log may hear of old
        // starts after an image brought it further).
        self.held = self.held.min(first - 1).max(self.applied);
        self.expected = self.expected.min(first - 1);
        self.peers.clear();
        self.restabilize();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(epoch: Epoch, cid: CommitId) -> WriteSet {
        WriteSet {
            domain: 0,
            epoch,
            cid,
            tx: TxId {
                node: 1,
                run: 0,
                n: cid,
            },
            writes: Vec::new(),
        }
    }

    fn cids(v: &[Arc<WriteSet>]) -> Vec<CommitId> {
        v.iter().map(|w| w.cid).collect()
    }

    #[test]
    fn held_counts_only_durable_contiguous_write_sets() {
        let mut log = DomainLog::new(3, 100);
        assert!(log.start(1, 1).is_empty());
        assert_eq!(log.offer(ws(1, 2), 1), Offer::Persist);
        assert_eq!(log.offer(ws(1, 1), 2), Offer::Persist);
        assert_eq!(log.offer(ws(1, 1), 3), Offer::Duplicate);
        assert!(!log.durable(1), "1 is not durable yet");
        assert!(log.durable(2));
        assert_eq!(log.held(), 2);
        // One node holding it is no majority of three.
        assert_eq!(log.stable(), 0);
        assert!(log.take_applicable().is_empty());
        log.peer_held(2, 1, 1);
        assert_eq!(log.stable(), 1);
        assert_eq!(cids(&log.take_applicable()), vec![1]);
        log.peer_held(3, 1, 2);
        assert_eq!(cids(&log.take_applicable()), vec![2]);
        assert_eq!(log.offer(ws(1, 2), 4), Offer::Duplicate);
        assert_eq!(cids(&log.history(1, 2)), vec![1, 2]);
    }

    #[test]
    fn gaps_are_reported_up_to_what_others_hold() {
        let mut log = DomainLog::new(3, 100);
        log.start(1, 1);
        log.offer(ws(1, 3), 1);
        log.durable(1);
        assert_eq!(log.missing(), vec![(1, 2)]);
        log.peer_held(2, 1, 6);
        assert_eq!(log.missing(), vec![(1, 2), (4, 6)]);
    }

    #[test]
    fn a_fence_stops_counting_and_the_next_start_keeps_only_what_is_below_it() {
        let mut log = DomainLog::new(3, 100);
        log.start(1, 1);
        for cid in 1..=4 {
            log.offer(ws(1, cid), cid);
        }
        log.durable(4);
        assert_eq!(log.fence(1), Some(4));
        assert_eq!(log.fence(7), None);
        // Fenced: nothing new of epoch 1 is taken, and reports of epoch 1 no longer count.
        assert_eq!(log.offer(ws(1, 5), 5), Offer::Refused);
        log.peer_held(2, 1, 4);
        assert_eq!(log.stable(), 0);
        // The next epoch starts at 3: 1 and 2 are committed, 3 and 4 of epoch 1 never were.
        let dropped = log.start(2, 3);
        assert_eq!(
            dropped,
            vec![
                TxId {
                    node: 1,
                    run: 0,
                    n: 3
                },
                TxId {
                    node: 1,
                    run: 0,
                    n: 4
                }
            ]
        );
        assert_eq!(log.held(), 2);
        // Committed, but installed only once a majority holds them in the new epoch.
        assert_eq!(log.stable(), 0);
        log.peer_held(2, 2, 2);
        assert_eq!(log.stable(), 2);
        assert_eq!(cids(&log.take_applicable()), vec![1, 2]);
        // Epoch 1's id 3 is refused; epoch 2's is taken.
        assert_eq!(log.offer(ws(1, 3), 6), Offer::Refused);
        assert_eq!(log.offer(ws(2, 3), 7), Offer::Persist);
        // A start that is not the next epoch's changes nothing.
        assert!(log.start(5, 1).is_empty());
        assert_eq!(log.epoch(), 2);
    }

    #[test]
    fn decided_ids_are_taken_late_from_their_own_epoch_only() {
        let mut log = DomainLog::new(3, 100);
        log.start(1, 1);
        // This node missed epoch 1 entirely; epoch 2 decides 1..=5 and epoch 3 decides 6..=7.
        assert_eq!(log.fence(1), Some(0));
        log.start(2, 6);
        assert_eq!(
            log.fence(2),
            Some(5),
            "what epoch 2's start decided is reported"
        );
        log.start(3, 8);
        assert_eq!(log.stable(), 0, "stable once a majority holds them");
        assert_eq!(log.missing(), vec![(1, 7)]);
        log.peer_held(2, 3, 7);
        assert_eq!(
            log.offer(ws(2, 5), 1),
            Offer::Refused,
            "5 belongs to epoch 1"
        );
        assert_eq!(log.offer(ws(1, 5), 1), Offer::Persist);
        assert_eq!(
            log.offer(ws(1, 6), 2),
            Offer::Refused,
            "6 belongs to epoch 2"
        );
        assert_eq!(log.offer(ws(2, 6), 2), Offer::Persist);
        // Decided ids apply in order once here and durable.
        assert!(log.take_applicable().is_empty());
        for cid in 1..=4 {
            log.offer(ws(1, cid), 2 + cid);
        }
        assert!(log.take_applicable().is_empty(), "nothing durable yet");
        log.durable(6);
        assert_eq!(cids(&log.take_applicable()), vec![1, 2, 3, 4, 5, 6]);
        // Applying never holds the held watermark back.
        assert_eq!(log.held(), 6);
        log.offer(ws(3, 8), 7);
        log.offer(ws(2, 7), 8);
        log.durable(8);
        assert_eq!(log.held(), 8);
    }

    #[test]
    fn an_image_replaces_what_was_applied_and_received_through_it() {
        let mut log = DomainLog::new(3, 2);
        log.start(1, 1);
        for cid in 1..=3 {
            log.offer(ws(1, cid), cid);
        }
        log.durable(3);
        log.peer_held(2, 1, 3);
        assert_eq!(cids(&log.take_applicable()), vec![1, 2, 3]);
        // Two kept: 1 is forgotten, 2 and 3 are not, 4 was never applied.
        assert!(log.forgot(1));
        assert!(!log.forgot(2));
        assert!(!log.forgot(4));
        let mut behind = DomainLog::new(3, 2);
        behind.start(1, 1);
        // Received 2 and 7, durable; the image covers 1..=5.
        behind.offer(ws(1, 2), 1);
        behind.offer(ws(1, 7), 2);
        behind.offer(ws(1, 6), 3);
        behind.durable(2);
        let tx = TxId {
            node: 1,
            run: 0,
            n: 4,
        };
        assert!(behind.install_image(5, &[(tx, 4)]));
        assert!(
            !behind.install_image(5, &[]),
            "an image not ahead is ignored"
        );
        assert_eq!((behind.applied(), behind.held()), (5, 5));
        assert_eq!(behind.stable(), 5);
        assert_eq!(behind.recent(), vec![(tx, 4)]);
        assert!(behind.forgot(3), "the history starts over after an image");
        // 6 becomes durable: held moves on from the image over 6 and 7.
        behind.durable(3);
        assert_eq!(behind.held(), 7);
        assert_eq!(behind.received_through(), 7);
        // An old start heard late (a node that lost its log replays the control log after an
        // image took it further) drops what was not installed, never what was.
        behind.start(2, 4);
        assert_eq!((behind.applied(), behind.held()), (5, 5));
    }
}
