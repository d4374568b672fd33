//! Raft messages from peers, checked before raft-rs sees them. raft-rs trusts its peers to be
//! correct raft-rs nodes: some malformed messages make it panic (a vote message with term 0, a
//! heartbeat committing beyond the log, entries out of sequence, a snapshot with another
//! configuration) or treat a peer's message as a local one (term 0). A replica runs every peer
//! message through [`check`] and drops what fails, with a warning: a correct peer never sends
//! such a message, so nothing a correct cluster needs is lost.

use raft::eraftpb::{ConfState, EntryType, Message, MessageType};

use crate::membership;

/// Terms and indexes at or above this are refused: a correct cluster adds one term per election
/// and one index per entry, so it never comes near, while raft-rs computes `term + 1` and
/// `index + 1` unchecked.
pub(crate) const CEILING: u64 = 1 << 48;

/// What a check needs to know of the receiving replica.
pub(crate) struct View {
    /// The receiving replica's id.
    pub(crate) me: u64,
    /// The index of the replica's last log entry.
    pub(crate) last_index: u64,
}

/// Why a peer's Raft message was dropped.
pub(crate) fn check(m: &Message, view: &View) -> Result<(), &'static str> {
    use MessageType::*;
    // The generated getters panic on a value the enum does not have.
    let kind = MessageType::from_i32(m.msg_type).ok_or("an unknown message type")?;
    match kind {
        MsgAppend
        | MsgAppendResponse
        | MsgRequestVote
        | MsgRequestVoteResponse
        | MsgRequestPreVote
        | MsgRequestPreVoteResponse
        | MsgSnapshot
        | MsgHeartbeat
        | MsgHeartbeatResponse => {}
        // A follower forwards proposals to the leader, without a term.
        MsgPropose => {
            let normal = |t| EntryType::from_i32(t) == Some(EntryType::EntryNormal);
            let entries_ok =
                !m.entries.is_empty() && m.entries.iter().all(|e| normal(e.entry_type));
            if m.term != 0 || !entries_ok {
                return Err("a forwarded proposal that is not one of normal entries");
            }
            return Ok(());
        }
        // Local messages (MsgHup, MsgBeat, ...) and features this layer does not use (leader
        // transfer, read index) never come from a peer.
        _ => return Err("a message type peers do not send"),
    }
    if m.term == 0 {
        return Err("no term (raft-rs would take it for a local message)");
    }
    let huge = [m.term, m.log_term, m.index, m.commit, m.reject_hint];
    if huge.iter().any(|&v| v >= CEILING) {
        return Err("a term or index beyond any a cluster reaches");
    }
    match kind {
        MsgAppend => {
            if m.log_term > m.term {
                return Err("an append whose previous entry is from a later term");
            }
            // raft-rs reads the term of an index past its log as 0: a zero term would match
            // there and commit beyond the log.
            if m.index > 0 && m.log_term == 0 {
                return Err("an append after an entry without a term");
            }
            let mut expected = m.index;
            let mut previous_term = m.log_term;
            for e in &m.entries {
                expected = expected.checked_add(1).ok_or("entry index overflow")?;
                if e.index != expected {
                    return Err("appended entries out of sequence");
                }
                if e.term == 0 || e.term < previous_term {
                    return Err("appended entries without a term, or with a term going back");
                }
                previous_term = e.term;
                if e.term > m.term {
                    return Err("an appended entry from a later term than the message");
                }
                // Replicas propose normal entries and version-2 configuration changes only.
                let kind = EntryType::from_i32(e.entry_type);
                if !matches!(
                    kind,
                    Some(EntryType::EntryNormal | EntryType::EntryConfChangeV2)
                ) {
                    return Err("an appended entry of a type replicas do not propose");
                }
            }
        }
        MsgHeartbeat if m.commit > view.last_index => {
            return Err("a heartbeat committing beyond this replica's log");
        }
        MsgAppendResponse if m.index > view.last_index => {
            return Err("an append response beyond this replica's log");
        }
        MsgAppendResponse if m.reject && m.reject_hint > m.index => {
            return Err("a rejection hinting beyond the rejected index");
        }
        MsgSnapshot => {
            let snap = m
                .snapshot
                .as_ref()
                .ok_or("a snapshot message without a snapshot")?;
            let meta = snap
                .metadata
                .as_ref()
                .ok_or("a snapshot without metadata")?;
            if meta.term > m.term {
                return Err("a snapshot from a later term than the message");
            }
            if meta.term == 0 || meta.index == 0 || meta.index >= CEILING {
                return Err("a snapshot without a term or position, or beyond any log");
            }
            let usable = meta
                .conf_state
                .as_ref()
                .is_some_and(|cs| membership::well_formed(cs) && includes(cs, view.me));
            if !usable {
                return Err(
                    "a snapshot of a configuration raft cannot take or without this replica",
                );
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether `cs` names replica `me` in any role.
fn includes(cs: &ConfState, me: u64) -> bool {
    [
        &cs.voters,
        &cs.voters_outgoing,
        &cs.learners,
        &cs.learners_next,
    ]
    .iter()
    .any(|ids| ids.contains(&me))
}
