//! The Raft glue: raft-rs's `RawNode` orders batch ids. Peers' Raft messages are checked
//! (`raft_guard`) before raft-rs sees them; its `Ready` is turned into log records, messages and
//! the commit index; appended entries that replace optimistically delivered ones revoke them.
//! A replica rejoining after losing its log neither votes nor campaigns (`lost_log`).

use prost::Message as _;
use raft::eraftpb::{Entry, HardState, Message, MessageType};

use atomos_seam::Output;

use super::config::ReplicaConfig;
use super::entries::entry_batch;
use super::Replica;
use crate::error::OrderError;
use crate::raft_guard;
use crate::record::Record;
use crate::types::{Action, Addr, OrderMsg, StateMachine};

/// raft-rs's settings for a replica whose log was applied through `applied`.
pub(super) fn raft_config(cfg: &ReplicaConfig, applied: u64) -> raft::Config {
    raft::Config {
        id: cfg.id,
        election_tick: cfg.election_ticks,
        heartbeat_tick: cfg.heartbeat_ticks,
        applied,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: cfg.max_inflight,
        check_quorum: true,
        pre_vote: true,
        // One value only: raft-rs draws it from its own generator, and runs must be
        // reproducible. The jitter comes from skipped ticks instead (see `tick`).
        min_election_tick: cfg.election_ticks,
        max_election_tick: cfg.election_ticks + 1,
        ..raft::Config::default()
    }
}

impl<S: StateMachine> Replica<S> {
    /// A Raft message from replica `from`: stepped into raft-rs if well formed, addressed
    /// here, and acceptable to a replica in this one's state.
    pub(super) fn on_raft(&mut self, from: Addr, bytes: &[u8], out: &mut Vec<Action>) {
        match Message::decode(bytes) {
            Ok(m) => self.on_raft_message(from, m, out),
            Err(e) => warn(
                out,
                format!("undecodable raft message from replica {from} dropped: {e}"),
            ),
        }
    }

    /// A decoded Raft message from replica `from` (sent whole, or a snapshot message whose
    /// data arrived as a stream): stepped into raft-rs if addressed here and acceptable.
    pub(super) fn on_raft_message(&mut self, from: Addr, m: Message, out: &mut Vec<Action>) {
        let m = match m {
            m if m.from == from && m.to == self.cfg.id => m,
            m => {
                return warn(
                    out,
                    format!(
                        "misaddressed raft message from replica {from} dropped (claims {} to {})",
                        m.from, m.to
                    ),
                )
            }
        };
        let view = raft_guard::View {
            me: self.cfg.id,
            last_index: self.raft.raft.raft_log.last_index(),
        };
        // The raw number: the enum's getter panics on a number it does not know, and the guard
        // below is what refuses those.
        let kind = m.msg_type;
        let is = |t: MessageType| kind == t as i32;
        if let Err(why) = raft_guard::check(&m, &view) {
            self.stats.raft_refused += 1;
            warn(
                out,
                format!("raft message of type {kind} from replica {from} refused: {why}"),
            );
            if is(MessageType::MsgHeartbeat)
                && m.commit > view.last_index
                && self
                    .lost_log
                    .report_behind(self.ticks, self.cfg.retry_ticks)
            {
                out.push(Output::Send {
                    to: from,
                    msg: OrderMsg::Behind {
                        last: view.last_index,
                    },
                });
            }
        } else if (is(MessageType::MsgRequestVote) || is(MessageType::MsgRequestPreVote))
            && self.lost_log.refuses_vote()
        {
            // Reported once, then counted: a rejoining replica withholds every vote.
            self.stats.votes_withheld += 1;
            if self.stats.votes_withheld == 1 {
                warn(
                    out,
                    format!(
                        "vote withheld from replica {from}: this replica rejoins after losing \
                         its log and has not caught up (further ones are only counted)"
                    ),
                );
            }
        } else if is(MessageType::MsgPropose) && !self.members.contains(from) {
            // A removed replica that has not heard of its removal still forms batches with
            // quorums of its old configuration: none of them is ordered.
            self.stats.from_non_members += 1;
        } else if is(MessageType::MsgAppend) && self.members.is_empty() && !m.entries.is_empty() {
            // A replica that joins knows no configuration: its first state must be a snapshot
            // (entries from the log's start would be applied to an empty configuration). The
            // append is taken without its entries: raft-rs then answers where its log stands,
            // and the leader sends a snapshot.
            let mut m = m;
            m.entries.clear();
            let _ = self.raft.step(m);
        } else if is(MessageType::MsgSnapshot)
            && self.check_raft_snapshot(m.get_snapshot()).is_err()
        {
            self.stats.snapshots_refused += 1;
            warn(
                out,
                format!("raft snapshot from replica {from} whose state does not decode refused"),
            );
        } else {
            if is(MessageType::MsgAppend) {
                self.lost_log.leader_appended(m.commit);
            }
            let mut m = m;
            if is(MessageType::MsgPropose) && self.is_leader() {
                // A replica whose log lags re-proposes its batches because it does not see them
                // ordered yet; ordering one again only lengthens the log it has to catch up on.
                m.entries
                    .retain(|e| entry_batch(e).is_none_or(|id| !self.batches.ordered(&id)));
                if m.entries.is_empty() {
                    self.stats.proposals_dropped += 1;
                    return;
                }
            }
            // Errors here are stale or irrelevant messages (raft-rs ignores them).
            let _ = self.raft.step(m);
        }
    }

    /// A peer's log ends at `last`: if this leader believes it holds more, it starts over with
    /// it from there (probing, or a snapshot if the log here no longer reaches back).
    pub(super) fn restart_peer(&mut self, peer: Addr, last: u64, out: &mut Vec<Action>) {
        if !self.is_leader() {
            return;
        }
        // What it reported delivering before it lost its log counts no more.
        self.forget_progress(peer);
        if let Some(pr) = self.raft.raft.mut_prs().get_mut(peer) {
            if pr.matched > last {
                let believed = pr.matched;
                pr.matched = last;
                pr.next_idx = last + 1;
                pr.become_probe();
                self.stats.peers_restarted += 1;
                warn(
                    out,
                    format!(
                        "replica {peer}'s log ends at {last}, before the {believed} it \
                         acknowledged: starting over with it"
                    ),
                );
            }
        }
    }

    fn send_raft(&mut self, msgs: Vec<Message>, out: &mut Vec<Action>) {
        for m in msgs {
            let kind = m.get_msg_type();
            if self.lost_log.refuses_vote()
                && matches!(
                    kind,
                    MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                )
            {
                // Rejoining: it neither votes nor campaigns (with another replica that missed
                // the entries it lost, it could win without them).
                continue;
            }
            if kind == MessageType::MsgSnapshot {
                // The snapshot goes as a stream of chunks, the message in its offer.
                self.stream_raft_snapshot(m, out);
                continue;
            }
            out.push(Output::Send {
                to: m.to,
                msg: OrderMsg::Raft(m.encode_to_vec()),
            });
        }
    }

    fn persist_hard_state(&mut self, hs: &HardState) {
        self.write(&Record::HardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        });
    }

    /// Takes whatever raft-rs has ready: messages out, a snapshot to install, entries and the
    /// hard state to persist, the commit index.
    pub(super) fn handle_ready(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        while self.raft.has_ready() {
            let mut rd = self.raft.ready();
            let msgs = rd.take_messages();
            self.send_raft(msgs, out);
            let mut wrote = false;
            if !rd.snapshot().is_empty() {
                let snap = rd.snapshot().clone();
                self.install(snap, out)?;
                wrote = true;
            }
            if !rd.entries().is_empty() {
                let ents = rd.take_entries();
                self.append(&ents, out)?;
                wrote = true;
            }
            if let Some(hs) = rd.hs() {
                let hs = hs.clone();
                self.persist_hard_state(&hs);
                self.raft.mut_store().set_hard_state(hs);
                wrote = true;
            }
            if wrote {
                self.flush(out);
            }
            let persisted = rd.take_persisted_messages();
            self.send_raft(persisted, out);
            if let Some(last) = rd.committed_entries().last() {
                self.delivery.commit = self.delivery.commit.max(last.index);
            }
            // Applied entries are reported as they are finally delivered (`sync_applied`):
            // raft-rs must not take a configuration change as applied before it is.
            let mut light = self.raft.advance_append(rd);
            if let Some(commit) = light.commit_index() {
                self.raft.mut_store().set_commit(commit);
                let hs = self.raft.store().hard_state().clone();
                self.persist_hard_state(&hs);
                self.flush(out);
            }
            let msgs = light.take_messages();
            self.send_raft(msgs, out);
            if let Some(last) = light.committed_entries().last() {
                self.delivery.commit = self.delivery.commit.max(last.index);
            }
        }
        Ok(())
    }

    /// Tells raft-rs how far entries are applied: those finally delivered here (never past
    /// what it counts committed and persisted).
    pub(super) fn sync_applied(&mut self) {
        let log = &self.raft.raft.raft_log;
        let applied = (self.delivery.final_next - 1)
            .min(log.committed)
            .min(log.persisted);
        if applied > log.applied {
            self.raft.advance_apply_to(applied);
        }
    }

    /// Appends entries to the log (and queues their record); revokes optimistic deliveries they
    /// replace. Entries that would not extend the log are refused, written nowhere, with a
    /// warning (raft-rs never hands such; a log replaying them would not open).
    fn append(&mut self, ents: &[Entry], out: &mut Vec<Action>) -> Result<(), OrderError> {
        let replaced = match self.raft.mut_store().append(ents) {
            Ok(replaced) => replaced,
            Err(outside) => {
                warn(out, outside.to_string());
                return Ok(());
            }
        };
        let encoded = ents.iter().map(|e| e.encode_to_vec()).collect();
        self.write(&Record::Entries(encoded));
        if let Some(cut) = replaced {
            if cut < self.delivery.final_next {
                return Err(OrderError::Diverged {
                    cut,
                    final_next: self.delivery.final_next,
                });
            }
            self.revoke(cut, out);
            self.batches.in_log.retain(|_, at| *at < cut);
            // The entries from `cut` on are new: no earlier write holds them.
            self.disk.clamp(cut - 1);
        }
        for e in ents {
            if let Some(id) = entry_batch(e) {
                self.batches.in_log.insert(id, e.index);
            }
        }
        Ok(())
    }
}

/// Reports something an operator should know.
pub(super) fn warn(out: &mut Vec<Action>, text: String) {
    out.push(Output::Warn(text));
}
