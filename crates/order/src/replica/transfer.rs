//! Snapshots streamed in chunks, so that a state of any size reaches a replica through frames
//! of a bounded size. A sender offers a stream (its size and checksum), sends chunks of at most
//! `chunk_bytes` a window at a time, and moves on as the receiver acknowledges the bytes it
//! holds in order; no progress for `retry_ticks` re-sends from the last acknowledged byte (a
//! broken connection resumes where it stopped), the wait doubling with each re-send that brings
//! none (so a slow link is not flooded with copies of what is still on its way); an
//! acknowledgement that repeats what the receiver holds while more was sent (a chunk came after
//! a lost one) sends the missing chunk again at once, once per gap; silence for
//! `give_up_ticks`, or four times that without progress, abandons the stream. The receiver keeps the bytes in order and a
//! window's worth of chunks that came ahead of a gap, acknowledges what it holds, checks the
//! checksum once it holds every byte, and only then acknowledges the last byte and hands the
//! snapshot over; a checksum that does not match starts the stream over. A receiver refuses a
//! stream larger than it accepts, and tells the sender, which then waits `give_up_ticks`
//! before it reports the stream ended (so that its caller does not offer it again at once).
//!
//! Pure bookkeeping: no Raft, no state machine. The replica decides what a stream carries and
//! what to do with it once complete.

use std::collections::BTreeMap;

use atomos_seam::Bytes;

use super::config::{PlantedBug, ReplicaConfig};
use crate::types::{Addr, OrderMsg, StreamKind};

/// How streams are cut and paced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamLimits {
    /// Bytes per chunk (at least 1).
    pub(crate) chunk_bytes: usize,
    /// Chunks sent beyond the last acknowledged byte (at least 1).
    pub(crate) window: usize,
    /// Ticks without progress before the sender first re-sends from the last acknowledged
    /// byte (each further re-send without progress waits twice as long, up to eight times).
    pub(crate) retry_ticks: u64,
    /// Ticks without any acknowledgement (sender) or chunk (receiver) before a stream is
    /// abandoned; a sender also abandons one after four times this without progress.
    pub(crate) give_up_ticks: u64,
    /// The largest stream a receiver accepts, in bytes.
    pub(crate) max_bytes: u64,
}

/// The checksum of a stream's bytes.
pub(crate) fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// A stream's bytes as the shared parts they lie in (a snapshot's state, then the replica's
/// tables), sent one after the other and never joined: a chunk may span two parts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Parts(Vec<Bytes>);

impl Parts {
    /// The stream of `parts`, in this order.
    pub(crate) fn new(parts: impl IntoIterator<Item = Bytes>) -> Parts {
        Parts(parts.into_iter().collect())
    }

    /// Its size in bytes.
    fn len(&self) -> u64 {
        self.0.iter().map(|p| p.len() as u64).sum()
    }

    /// The checksum of its bytes, as if they were one.
    fn checksum(&self) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        for part in &self.0 {
            hasher.update(part);
        }
        hasher.finalize()
    }

    /// A copy of bytes `from..to` (within its size).
    fn copy(&self, from: u64, to: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(to.saturating_sub(from) as usize);
        let mut base = 0u64;
        for part in &self.0 {
            let end = base + part.len() as u64;
            if end > from && base < to {
                let start = (from.max(base) - base) as usize;
                let stop = (to.min(end) - base) as usize;
                out.extend_from_slice(&part[start..stop]);
            }
            base = end;
        }
        out
    }
}

impl From<Bytes> for Parts {
    fn from(bytes: Bytes) -> Parts {
        Parts(vec![bytes])
    }
}

/// One stream being sent.
struct Outgoing {
    stream: u64,
    kind: StreamKind,
    data: Parts,
    checksum: u32,
    /// Bytes the receiver acknowledged holding, in order.
    acked: u64,
    /// Bytes sent so far (chunks past `acked` may be in flight).
    sent: u64,
    /// When the receiver last acknowledged anything of it (or the stream started).
    heard_at: u64,
    /// When the receiver last acknowledged more bytes (or the stream started).
    progressed_at: u64,
    /// When the unacknowledged part was last sent (again), or progress last acknowledged.
    resent_at: u64,
    /// Re-sends since the last progress: the next waits `retry_ticks << backoff`.
    backoff: u32,
    /// The acknowledged count for which the next chunk was sent again at once, on an
    /// acknowledgement that repeated it (the receiver holds chunks past a gap).
    refilled_at: Option<u64>,
    /// The receiver refused it (why): nothing more is sent, and it ends at this tick.
    refused: Option<(String, u64)>,
}

/// The longest wait between re-sends, in `retry_ticks` (as a power of two): eight periods, so
/// that several re-sends still fit in the give-up time.
const MAX_BACKOFF: u32 = 3;

/// How a stream a sender started ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// The receiver holds every byte and the checksum matched.
    Delivered { to: Addr, kind: StreamKind },
    /// The receiver went silent for `give_up_ticks`; the stream is dropped.
    Abandoned { to: Addr, kind: StreamKind },
    /// The receiver refused it (too large for it), saying why.
    Refused {
        to: Addr,
        kind: StreamKind,
        reason: String,
    },
}

/// How far the snapshot streams going one way (out of a replica, or into it) have come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamProgress {
    /// Streams under way.
    pub streams: u64,
    /// Bytes of the streams under way that their receiver holds in order (acknowledged, for
    /// a sender).
    pub done: u64,
    /// The sizes of the streams under way.
    pub total: u64,
    /// Bytes received in order (acknowledged, for a sender) over every stream since the
    /// replica started: its rate is the transfer's.
    pub moved: u64,
}

/// The streams a replica sends: one per receiver at a time (a newer one replaces it).
/// Streams are numbered from a base drawn at each start of the replica, so that a receiver
/// never takes a stream of this start for one of an earlier start (numbers from 1 would
/// repeat after a restart, and a receiver would answer the new stream with what it holds
/// of the old one).
pub(crate) struct Senders {
    limits: StreamLimits,
    out: BTreeMap<Addr, Outgoing>,
    next_stream: u64,
    /// Bytes acknowledged over every stream.
    moved: u64,
}

impl Senders {
    /// Senders whose streams are numbered from `first` on (drawn at random at each start).
    pub(crate) fn new(limits: StreamLimits, first: u64) -> Senders {
        Senders {
            limits,
            out: BTreeMap::new(),
            next_stream: first,
            moved: 0,
        }
    }

    /// How far the streams sent from here have come.
    pub(crate) fn progress(&self) -> StreamProgress {
        StreamProgress {
            streams: self.out.len() as u64,
            done: self.out.values().map(|o| o.acked).sum(),
            total: self.out.values().map(|o| o.data.len()).sum(),
            moved: self.moved,
        }
    }

    /// Whether a stream to `to` is under way.
    pub(crate) fn sending_to(&self, to: Addr) -> bool {
        self.out.contains_key(&to)
    }

    /// Whether a stream of a Raft snapshot to `to` is under way.
    pub(crate) fn sending_raft_to(&self, to: Addr) -> bool {
        self.out
            .get(&to)
            .is_some_and(|o| matches!(o.kind, StreamKind::Raft(_)))
    }

    /// Starts streaming `data` to `to` (replacing a stream under way to it, which is
    /// returned as abandoned): the offer and the first window of chunks.
    pub(crate) fn start(
        &mut self,
        now: u64,
        to: Addr,
        kind: StreamKind,
        data: Parts,
        msgs: &mut Vec<(Addr, OrderMsg)>,
    ) -> Option<Sent> {
        let stream = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(1);
        let replaced = self.out.insert(
            to,
            Outgoing {
                stream,
                kind,
                checksum: data.checksum(),
                data,
                acked: 0,
                sent: 0,
                heard_at: now,
                progressed_at: now,
                resent_at: now,
                backoff: 0,
                refilled_at: None,
                refused: None,
            },
        );
        self.offer_and_fill(to, msgs);
        replaced.map(|o| Sent::Abandoned { to, kind: o.kind })
    }

    /// The receiver `from` holds `next` bytes of `stream`: more chunks, or the end.
    pub(crate) fn on_ack(
        &mut self,
        now: u64,
        from: Addr,
        stream: u64,
        next: u64,
        msgs: &mut Vec<(Addr, OrderMsg)>,
    ) -> Option<Sent> {
        let o = self
            .out
            .get_mut(&from)
            .filter(|o| o.stream == stream && o.refused.is_none())?;
        let total = o.data.len();
        if next > total {
            return None;
        }
        // Any acknowledgement says the receiver is alive (on a slow link the progress may be
        // queued behind copies sent again).
        o.heard_at = now;
        if next > o.acked {
            self.moved += next - o.acked;
            o.acked = next;
            o.progressed_at = now;
            o.resent_at = now;
            o.backoff = 0;
        } else if next == o.acked && o.sent > o.acked && o.refilled_at != Some(next) {
            // The receiver repeats what it holds while more was sent: a chunk after it came
            // and the next one did not (lost, or the receiver's inbox was full). That one
            // chunk goes again at once, once per gap; the timer covers the rest.
            o.refilled_at = Some(next);
            let chunk = self.limits.chunk_bytes.max(1) as u64;
            let end = (next + chunk).min(total);
            msgs.push((
                from,
                OrderMsg::StreamChunk {
                    stream,
                    offset: next,
                    data: o.data.copy(next, end),
                },
            ));
            return None;
        } else if next == 0 && o.acked > 0 {
            // The receiver holds nothing of it any more (its checksum did not match, or it
            // restarted): the sender starts over. (A lower, non-zero count is an older
            // acknowledgement overtaken by a later one: ignored.)
            o.acked = 0;
            o.sent = 0;
            o.refilled_at = None;
            o.backoff = 0;
            o.resent_at = now;
        }
        if o.acked == total {
            let o = self.out.remove(&from)?;
            return Some(Sent::Delivered {
                to: from,
                kind: o.kind,
            });
        }
        o.sent = o.sent.max(o.acked);
        self.fill(from, msgs);
        None
    }

    /// The receiver `from` refused `stream`: nothing more is sent; it ends (reported by
    /// [`Senders::tick`]) `give_up_ticks` from now.
    pub(crate) fn on_refused(&mut self, now: u64, from: Addr, stream: u64, reason: String) {
        if let Some(o) = self.out.get_mut(&from).filter(|o| o.stream == stream) {
            if o.refused.is_none() {
                o.refused = Some((reason, now + self.limits.give_up_ticks));
            }
        }
    }

    /// Time passes: receivers that acknowledged no progress get the unacknowledged part
    /// again, from the offer on, each time after twice as long; receivers silent too long are
    /// given up on; refused streams end once their wait is over.
    pub(crate) fn tick(&mut self, now: u64, msgs: &mut Vec<(Addr, OrderMsg)>) -> Vec<Sent> {
        let mut ended = Vec::new();
        let limits = self.limits;
        let silent: Vec<Addr> = self
            .out
            .iter()
            .filter(|(_, o)| {
                // Silent, or answering without ever getting further (chunks it cannot take,
                // say a frame limit smaller than the sender's chunks): either way it ends.
                o.refused.is_none()
                    && (now >= o.heard_at + limits.give_up_ticks
                        || now >= o.progressed_at + 4 * limits.give_up_ticks)
            })
            .map(|(to, _)| *to)
            .collect();
        for to in silent {
            if let Some(o) = self.out.remove(&to) {
                ended.push(Sent::Abandoned { to, kind: o.kind });
            }
        }
        let due: Vec<Addr> = self
            .out
            .iter()
            .filter(|(_, o)| match &o.refused {
                Some((_, until)) => now >= *until,
                None => now >= o.resent_at + (limits.retry_ticks << o.backoff),
            })
            .map(|(to, _)| *to)
            .collect();
        for to in due {
            let Some(o) = self.out.get_mut(&to) else {
                continue;
            };
            if o.refused.is_some() {
                if let Some(Outgoing {
                    kind,
                    refused: Some((reason, _)),
                    ..
                }) = self.out.remove(&to)
                {
                    ended.push(Sent::Refused { to, kind, reason });
                }
                continue;
            }
            o.resent_at = now;
            o.backoff = (o.backoff + 1).min(MAX_BACKOFF);
            o.sent = o.acked;
            self.offer_and_fill(to, msgs);
        }
        ended
    }

    fn offer_and_fill(&mut self, to: Addr, msgs: &mut Vec<(Addr, OrderMsg)>) {
        self.offer(to, msgs);
        self.fill(to, msgs);
    }

    fn offer(&mut self, to: Addr, msgs: &mut Vec<(Addr, OrderMsg)>) {
        let Some(o) = self.out.get_mut(&to) else {
            return;
        };
        // The offer's acknowledgement repeats what the receiver holds by design: it is no
        // sign of a gap.
        o.refilled_at = Some(o.acked);
        msgs.push((
            to,
            OrderMsg::StreamOffer {
                stream: o.stream,
                kind: o.kind.clone(),
                total: o.data.len(),
                checksum: o.checksum,
            },
        ));
    }

    /// Sends chunks until `window` chunks past the acknowledged bytes are out.
    fn fill(&mut self, to: Addr, msgs: &mut Vec<(Addr, OrderMsg)>) {
        let limits = self.limits;
        let Some(o) = self.out.get_mut(&to) else {
            return;
        };
        let chunk = limits.chunk_bytes.max(1) as u64;
        let horizon = o.acked + chunk * limits.window.max(1) as u64;
        let total = o.data.len();
        while o.sent < total && o.sent < horizon {
            let end = (o.sent + chunk).min(total);
            msgs.push((
                to,
                OrderMsg::StreamChunk {
                    stream: o.stream,
                    offset: o.sent,
                    data: o.data.copy(o.sent, end),
                },
            ));
            o.sent = end;
        }
    }
}

/// One stream being received.
struct Incoming {
    stream: u64,
    kind: StreamKind,
    total: u64,
    checksum: u32,
    /// The bytes held in order, from the first.
    data: Vec<u8>,
    /// Chunks that arrived ahead of a missing one, by offset (at most a window's worth past
    /// `data`): taken once the gap is filled, so a reordering network costs no re-send.
    ahead: BTreeMap<u64, Vec<u8>>,
    heard_at: u64,
}

/// A stream as its sender offers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    /// Its number at its sender.
    pub(crate) stream: u64,
    /// What it carries.
    pub(crate) kind: StreamKind,
    /// Its size in bytes.
    pub(crate) total: u64,
    /// The CRC-32 of its bytes.
    pub(crate) checksum: u32,
}

/// What a receiver made of a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// Nothing complete yet (an acknowledgement may have been queued).
    Nothing,
    /// Every byte arrived and the checksum matched.
    Complete { kind: StreamKind, data: Vec<u8> },
    /// The offer was refused (too large): said at most once per give-up period per sender.
    Refused(String),
    /// Every byte arrived but the checksum did not match: the stream starts over.
    Corrupt(String),
}

/// The streams a replica receives: one per sender at a time (another one replaces it).
pub(crate) struct Receivers {
    limits: StreamLimits,
    /// The planted bug [`PlantedBug::UncheckedStream`].
    unchecked: bool,
    incoming: BTreeMap<Addr, Incoming>,
    /// Per sender, the last stream completed here and its size: a sender that missed the
    /// final acknowledgement is told again instead of sending it all once more.
    completed: BTreeMap<Addr, (u64, u64)>,
    /// Per sender, when a refusal was last reported (one report per `give_up_ticks`).
    refused: BTreeMap<Addr, u64>,
    /// Bytes taken in order over every stream.
    moved: u64,
}

impl Receivers {
    pub(crate) fn new(limits: StreamLimits) -> Receivers {
        Receivers {
            limits,
            unchecked: false,
            incoming: BTreeMap::new(),
            completed: BTreeMap::new(),
            refused: BTreeMap::new(),
            moved: 0,
        }
    }

    /// How far the streams coming here have come.
    pub(crate) fn progress(&self) -> StreamProgress {
        StreamProgress {
            streams: self.incoming.len() as u64,
            done: self.incoming.values().map(|i| i.data.len() as u64).sum(),
            total: self.incoming.values().map(|i| i.total).sum(),
            moved: self.moved,
        }
    }

    /// Bytes held for streams not complete yet.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.incoming.values().map(|i| i.data.len() as u64).sum()
    }

    /// `from` offers a stream: taken (acknowledged with the bytes held), replacing another
    /// held from it, unless larger than this replica accepts. (An older offer overtaken by a
    /// newer one may replace it for a while: the newer one's sender offers it again.)
    pub(crate) fn on_offer(
        &mut self,
        now: u64,
        from: Addr,
        offer: Offer,
        msgs: &mut Vec<(Addr, OrderMsg)>,
    ) -> Received {
        let Offer {
            stream,
            kind,
            total,
            checksum,
        } = offer;
        if total > self.limits.max_bytes {
            let reason = format!(
                "a snapshot of {total} bytes from replica {from} refused: larger than the {} \
                 bytes this replica accepts (snapshot_max_bytes)",
                self.limits.max_bytes
            );
            msgs.push((
                from,
                OrderMsg::StreamRefused {
                    stream,
                    reason: reason.clone(),
                },
            ));
            let reported = self.refused.get(&from).copied();
            if reported.is_some_and(|at| now < at + self.limits.give_up_ticks) {
                return Received::Nothing;
            }
            self.refused.insert(from, now);
            return Received::Refused(reason);
        }
        if self.ack_completed(from, stream, msgs) {
            return Received::Nothing;
        }
        match self.incoming.get_mut(&from) {
            Some(i) if i.stream == stream => i.heard_at = now,
            _ => {
                self.incoming.insert(
                    from,
                    Incoming {
                        stream,
                        kind,
                        total,
                        checksum,
                        data: Vec::new(),
                        ahead: BTreeMap::new(),
                        heard_at: now,
                    },
                );
            }
        }
        self.finish_or_ack(now, from, msgs)
    }

    /// A chunk of `stream` from `from`: kept if it is the next one, acknowledged either way.
    pub(crate) fn on_chunk(
        &mut self,
        now: u64,
        from: Addr,
        stream: u64,
        offset: u64,
        data: &[u8],
        msgs: &mut Vec<(Addr, OrderMsg)>,
    ) -> Received {
        let Some(i) = self.incoming.get_mut(&from).filter(|i| i.stream == stream) else {
            self.ack_completed(from, stream, msgs);
            return Received::Nothing;
        };
        let held = i.data.len() as u64;
        let end = offset.saturating_add(data.len() as u64);
        if end <= held && !self.unchecked {
            // A copy of what it holds (sent again on a timer): no answer, which the sender
            // would take for a gap. The offer sent with every re-send is answered instead.
            return Received::Nothing;
        }
        let in_order = offset == held || self.unchecked;
        let reach = self.limits.chunk_bytes as u64 * self.limits.window as u64;
        if data.is_empty() || end > i.total || held + data.len() as u64 > i.total {
            // Nothing of it fits the stream: not kept.
        } else if in_order {
            let before = i.data.len() as u64;
            if i.data.capacity() == 0 {
                // Room for the whole stream at once, so that growing it never holds two
                // copies (if the allocator cannot, it grows as it goes).
                let _ = i.data.try_reserve_exact(i.total as usize);
            }
            i.data.extend_from_slice(data);
            i.heard_at = now;
            // Chunks that came ahead of this one and now follow on.
            while let Some(next) = i.ahead.remove(&(i.data.len() as u64)) {
                i.data.extend_from_slice(&next);
            }
            let held = i.data.len() as u64;
            self.moved += held - before;
            i.ahead.retain(|&at, _| at > held);
        } else if offset > held
            && offset <= held + reach
            && i.ahead.values().map(Vec::len).sum::<usize>() + data.len() <= reach as usize
        {
            // Ahead of a missing chunk: kept (up to a window's worth of bytes) until the gap
            // is filled; the acknowledgement below asks for the gap.
            i.ahead.insert(offset, data.to_vec());
            i.heard_at = now;
        }
        self.finish_or_ack(now, from, msgs)
    }

    /// Once every byte of `from`'s stream is here: checked, acknowledged whole and handed
    /// over, or started over if the checksum does not match. Before: acknowledged as far as
    /// it goes.
    fn finish_or_ack(
        &mut self,
        now: u64,
        from: Addr,
        msgs: &mut Vec<(Addr, OrderMsg)>,
    ) -> Received {
        let whole = self
            .incoming
            .get(&from)
            .is_some_and(|i| i.data.len() as u64 == i.total);
        if !whole {
            self.ack(from, msgs);
            return Received::Nothing;
        }
        let Some(done) = self.incoming.remove(&from) else {
            return Received::Nothing;
        };
        let stream = done.stream;
        let sum = checksum(&done.data);
        if sum != done.checksum && !self.unchecked {
            // Start over: the sender re-sends from byte 0.
            let why = format!(
                "a snapshot from replica {from} arrived whole but its checksum {sum:#010x} is \
                 not the offered {:#010x}: asked again",
                done.checksum
            );
            self.incoming.insert(
                from,
                Incoming {
                    data: Vec::new(),
                    ahead: BTreeMap::new(),
                    heard_at: now,
                    ..done
                },
            );
            self.ack(from, msgs);
            return Received::Corrupt(why);
        }
        msgs.push((
            from,
            OrderMsg::StreamAck {
                stream,
                next: done.total,
            },
        ));
        self.completed.insert(from, (stream, done.total));
        Received::Complete {
            kind: done.kind,
            data: done.data,
        }
    }

    /// Streams whose sender went silent for `give_up_ticks` are dropped (their memory too).
    pub(crate) fn tick(&mut self, now: u64) {
        let give_up = self.limits.give_up_ticks;
        self.incoming.retain(|_, i| now < i.heard_at + give_up);
    }

    /// If `stream` is the last one completed from `from`, acknowledges it whole again (the
    /// sender missed the final acknowledgement) and answers true.
    fn ack_completed(&self, from: Addr, stream: u64, msgs: &mut Vec<(Addr, OrderMsg)>) -> bool {
        let Some(&(_, total)) = self.completed.get(&from).filter(|c| c.0 == stream) else {
            return false;
        };
        msgs.push((
            from,
            OrderMsg::StreamAck {
                stream,
                next: total,
            },
        ));
        true
    }

    fn ack(&self, from: Addr, msgs: &mut Vec<(Addr, OrderMsg)>) {
        if let Some(i) = self.incoming.get(&from) {
            msgs.push((
                from,
                OrderMsg::StreamAck {
                    stream: i.stream,
                    next: i.data.len() as u64,
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests;

/// A replica's streams, both ways.
pub(crate) struct Streams {
    pub(crate) senders: Senders,
    pub(crate) receivers: Receivers,
}

impl Streams {
    /// Streams cut and paced by `cfg`: chunks of `snapshot_chunk_bytes`, four in flight,
    /// re-sent after two retry periods without progress (then backing off), given up on after
    /// sixty without any acknowledgement or 240 without progress.
    pub(crate) fn new(cfg: &ReplicaConfig, first_stream: u64) -> Streams {
        let retry = cfg.retry_ticks.max(1);
        let limits = StreamLimits {
            chunk_bytes: cfg.snapshot_chunk_bytes.max(1),
            window: 4,
            retry_ticks: 2 * retry,
            give_up_ticks: 60 * retry,
            max_bytes: cfg.snapshot_max_bytes,
        };
        let mut receivers = Receivers::new(limits);
        receivers.unchecked = cfg.planted_bug == Some(PlantedBug::UncheckedStream);
        Streams {
            senders: Senders::new(limits, first_stream),
            receivers,
        }
    }
}
