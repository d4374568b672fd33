//! Client deduplication: what became of each client's latest request, who waits for an answer
//! here, and which of a batch's requests an entry delivers. Pure bookkeeping, with no Raft and
//! no disk: every verdict is a function of the log prefix (and of the log's time), so that
//! every replica and every replay of a log decide a re-sent request alike.
//!
//! Sessions expire by the log's time, as Raft's client sessions do, so that the table holds
//! only clients that may still be heard from. A client's session lives until the latest
//! deadline of the requests the log delivered for it (its `until`); once the log's time passes
//! that, no request the session could refuse can run any more (each has a deadline at most
//! `until`), so the session is forgotten (swept once the whole step of [`ENDING_STEP_MS`] its
//! end falls in is past). The rule is part of the log's meaning: at an entry
//! whose time is past a session's `until`, the session counts as absent, whether or not this
//! replica has swept it yet, so forgetting never changes a verdict.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::types::{Addr, OrderMsg, Request};

/// What became of a client's latest finally delivered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Last {
    /// It ran; the state machine's answer.
    Answered(Vec<u8>),
    /// It expired (it never ran).
    Expired,
    /// It expired there, and whether an earlier copy ran in an earlier session of its
    /// client is not known.
    Unknown,
}

impl Last {
    /// What a client that sent request `seq` (the one this is the outcome of) is told.
    pub(super) fn message(&self, client: u64, seq: u64) -> OrderMsg {
        match self {
            Last::Answered(response) => OrderMsg::Reply {
                client,
                seq,
                response: response.clone(),
            },
            Last::Expired => OrderMsg::Expired { client, seq },
            Last::Unknown => OrderMsg::Unknown { client, seq },
        }
    }
}

/// A client's session: its latest finally delivered request, what became of it, and until
/// when the session lives (part of the replicated state: snapshots carry it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Session {
    /// The request's number.
    pub(super) seq: u64,
    /// What became of it.
    pub(super) outcome: Last,
    /// The latest deadline of the client's requests the log delivered while the session
    /// lived: past it in log time, the session is forgotten.
    pub(super) until: u64,
    /// The log's time when the session began: every earlier session of its client had ended
    /// before, so a request with a deadline from then on ran in none of them.
    pub(super) since: u64,
}

/// A forgotten session, as its bucket remembers it (part of the replicated state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Forgotten {
    /// Until when it lived...
    pub(super) until: u64,
    /// ...whose it was...
    pub(super) client: u64,
    /// ...its latest number...
    pub(super) last: u64,
    /// ...and since when it lived.
    pub(super) since: u64,
}

/// What deduplication needs of a session: its latest number and until when it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    last: u64,
    until: u64,
}

impl Span {
    /// The session after the log delivered (ran or expired) request `seq` with deadline
    /// `deadline` at log time `time`, from `before` (the session then, if any). A session past
    /// its `until` counts as absent; a request that expired for a client without a live
    /// session starts none (it could refuse nothing: every copy of it expires too).
    fn after(before: Option<Span>, seq: u64, deadline: u64, time: u64) -> Option<Span> {
        match before.filter(|s| s.until >= time) {
            Some(s) => Some(Span {
                last: s.last.max(seq),
                until: s.until.max(deadline),
            }),
            None if deadline >= time => Some(Span {
                last: seq,
                until: deadline,
            }),
            None => None,
        }
    }

    /// The session's latest number if it still lives at log time `time`.
    fn live_last(span: Option<Span>, time: u64) -> Option<u64> {
        span.filter(|s| s.until >= time).map(|s| s.last)
    }
}

/// What a replica does with a client's request that reaches it.
#[derive(Debug, PartialEq)]
pub(super) enum Reception {
    /// Answer the sender with this (the request was decided already) and take nothing.
    Answer(OrderMsg),
    /// Drop it: a later request of its client was decided (the client moved on).
    Drop,
    /// Order it: its sender waits here for the answer.
    Order,
}

/// What the log decided of one request of a batch at its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Decided {
    /// The request's client...
    pub(super) client: u64,
    /// ...number...
    pub(super) seq: u64,
    /// ...and deadline.
    pub(super) deadline: u64,
    /// Whether it runs there (else it expired there).
    pub(super) runs: bool,
}

/// What becomes of a batch's requests at its entry.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Admission {
    /// The requests delivered there, in the batch's order.
    pub(super) admitted: Vec<Request>,
    /// Every request decided there (admitted or expired), in the batch's order; duplicates
    /// and requests older than one their client had delivered are not among them.
    pub(super) decided: Vec<Decided>,
}

/// What the entries delivered optimistically and not yet final did to one client's session.
#[derive(Clone, Copy, Debug)]
struct Touched {
    /// How many of its requests those entries decided (one request may be decided at two of
    /// them: a copy that expires after its session ended).
    decided: usize,
    /// Its session after those entries (`None`: none that lives at any later time).
    span: Option<Span>,
}

/// What the entries delivered optimistically and not yet final did to the clients' sessions:
/// what deduplication of a later entry sees beside the final table.
#[derive(Clone, Debug, Default)]
pub(super) struct Ahead {
    /// The clients those entries touched.
    touched: FxHashMap<u64, Touched>,
}

impl Ahead {
    /// The entry deciding `decided` became final: what it decided is the final table's now.
    pub(super) fn finished(&mut self, decided: &[Decided]) {
        for d in decided {
            if let Some(t) = self.touched.get_mut(&d.client) {
                t.decided -= 1;
                if t.decided == 0 {
                    self.touched.remove(&d.client);
                }
            }
        }
    }

    /// Rebuilds what is ahead from the entries still pending (after a revocation): each one's
    /// decided requests and log time, in log order, over the final table `table`.
    pub(super) fn rebuild<'a>(
        table: &ClientTable,
        pending: impl Iterator<Item = (&'a [Decided], u64)>,
    ) -> Ahead {
        let mut ahead = Ahead::default();
        for (decided, time) in pending {
            for d in decided {
                let before = ahead.span(table, d.client);
                ahead.note(table, *d, before, time);
            }
        }
        ahead
    }

    /// The entry at log time `time` decided `d`, whose client's session was `before`.
    fn note(&mut self, table: &ClientTable, d: Decided, before: Option<Span>, time: u64) {
        let span = Span::after(before, d.seq, table.session_end(d.deadline), time);
        let t = self.touched.entry(d.client).or_insert(Touched {
            decided: 0,
            span: None,
        });
        t.decided += 1;
        t.span = span;
    }

    fn span(&self, table: &ClientTable, client: u64) -> Option<Span> {
        match self.touched.get(&client) {
            Some(t) => t.span,
            None => table.sessions.get(&client).map(|s| Span {
                last: s.seq,
                until: s.until,
            }),
        }
    }
}

/// The clients' table of one replica.
#[derive(Default)]
pub(super) struct ClientTable {
    /// Per client: its live session (part of the replicated state: snapshots carry it).
    sessions: BTreeMap<u64, Session>,
    /// Every session by the step of when it ends ([`ending_step`]): (step, client).
    ending: BTreeSet<(u64, u64)>,
    /// Per bucket of clients ([`bucket`]): of the sessions of its clients forgotten so far,
    /// the one that lived latest (replicated; see [`ClientTable::past_deadline`]). At most
    /// [`BUCKETS`] entries, whatever the number of clients.
    forgotten: BTreeMap<u16, Forgotten>,
    /// Per client: the request waiting for an answer here, and where to send it (local).
    awaiting: FxHashMap<u64, (u64, Addr)>,
    /// How long before its latest deadline a session ends (0: at it; more only as a planted
    /// bug).
    ends_early: u64,
}

impl ClientTable {
    /// A table holding a snapshot's sessions and what it knows of forgotten ones, with
    /// nobody waiting.
    pub(super) fn from_sessions(
        sessions: BTreeMap<u64, Session>,
        forgotten: BTreeMap<u16, Forgotten>,
    ) -> ClientTable {
        let mut table = ClientTable::default();
        table.restore(sessions, forgotten);
        table
    }

    /// Ends every session `ms` before its latest deadline (a planted bug: 0 is right).
    pub(super) fn end_sessions_early(&mut self, ms: u64) {
        self.ends_early = ms;
    }

    /// Until when a request with deadline `deadline` keeps its client's session.
    fn session_end(&self, deadline: u64) -> u64 {
        deadline.saturating_sub(self.ends_early)
    }

    /// Each client's session.
    pub(super) fn sessions(&self) -> &BTreeMap<u64, Session> {
        &self.sessions
    }

    /// Per bucket of clients, the forgotten session that lived latest.
    pub(super) fn forgotten(&self) -> &BTreeMap<u16, Forgotten> {
        &self.forgotten
    }

    /// Replaces the delivered part with a snapshot's; who waits here stays.
    pub(super) fn restore(
        &mut self,
        sessions: BTreeMap<u64, Session>,
        forgotten: BTreeMap<u16, Forgotten>,
    ) {
        self.ending = sessions
            .iter()
            .map(|(c, s)| (ending_step(s.until), *c))
            .collect();
        self.sessions = sessions;
        self.forgotten = forgotten;
    }

    /// Whether request `seq` of `client` is decided: it or a later one of its client was
    /// finally delivered in the session the table holds (which may have ended and not been
    /// swept yet: the request was decided all the same).
    pub(super) fn decided(&self, client: u64, seq: u64) -> bool {
        self.sessions.get(&client).is_some_and(|s| seq <= s.seq)
    }

    /// Forgets the sessions whose whole step of ends ([`ENDING_STEP_MS`]) is before log time
    /// `time`; returns how many. Called at every final entry with its time, before the
    /// entry's requests are recorded. (A session past its end and not swept yet counts as
    /// absent all the same: see the module's comment.)
    pub(super) fn sweep(&mut self, time: u64) -> u64 {
        let mut forgotten = 0;
        while let Some(&(step, client)) = self.ending.first() {
            if step.saturating_add(1).saturating_mul(ENDING_STEP_MS) > time {
                break;
            }
            self.ending.pop_first();
            if let Some(session) = self.sessions.remove(&client) {
                self.forgot(client, &session);
            }
            forgotten += 1;
        }
        forgotten
    }

    /// `session` of `client` is forgotten: its bucket remembers it if it lived latest.
    fn forgot(&mut self, client: u64, session: &Session) {
        let this = Forgotten {
            until: session.until,
            client,
            last: session.seq,
            since: session.since,
        };
        let latest = self.forgotten.entry(bucket(client)).or_insert(this);
        if this.until >= latest.until {
            *latest = this;
        }
    }

    /// What a client is told of its request `seq`, whose deadline is past the log's time
    /// and which its live session (if any) did not run (the session's latest number is
    /// below `seq`): that it expired if no earlier session of its client can have run it,
    /// else that its outcome is unknown.
    ///
    /// A session that ran it lived until the deadline or later, and began before it. Every
    /// session of a client began after the one before it ended. So it cannot have run in an
    /// earlier session if its deadline is not before the live session began; nor if no
    /// forgotten session of its bucket lived as late as its deadline; nor if the bucket's
    /// latest is its client's own (hence its client's latest forgotten session), began
    /// before the deadline and ended below `seq`.
    fn past_deadline(&self, client: u64, seq: u64, deadline: u64) -> OrderMsg {
        let after_live_began = self
            .sessions
            .get(&client)
            .is_some_and(|s| deadline >= s.since);
        let never_ran = after_live_began
            || match self.forgotten.get(&bucket(client)) {
                None => true,
                Some(f) if deadline > f.until => true,
                Some(f) => f.client == client && seq > f.last && deadline >= f.since,
            };
        if never_ran {
            OrderMsg::Expired { client, seq }
        } else {
            OrderMsg::Unknown { client, seq }
        }
    }

    /// Decides what to do with `req` from `from`, when the log's final time is `final_time`.
    /// A request its client already had decided is answered (if it is the latest) or dropped;
    /// one whose deadline is before `final_time` cannot run any more, and is answered so
    /// (expired, or unknown if a forgotten session may have run it); any other is ordered,
    /// and its sender is remembered to be answered.
    pub(super) fn receive(&mut self, from: Addr, req: &Request, final_time: u64) -> Reception {
        let (client, seq) = (req.client, req.seq);
        let session = self.sessions.get(&client);
        if let Some(s) = session {
            if s.seq > seq {
                return Reception::Drop;
            }
            if s.seq == seq {
                return Reception::Answer(s.outcome.message(client, seq));
            }
        }
        if req.deadline_ms < final_time {
            // Every later position's time is past the deadline: it never runs from now on.
            return Reception::Answer(self.past_deadline(client, seq, req.deadline_ms));
        }
        self.awaiting.insert(req.client, (req.seq, from));
        Reception::Order
    }

    /// Request `req` was in a batch that lapsed: if its sender waits here for it, whom to
    /// tell what (its outcome if it was decided before, else that it expired or that its
    /// outcome is unknown). The table itself does not change.
    pub(super) fn lapsed(&mut self, req: &Request) -> Option<(Addr, OrderMsg)> {
        let (client, seq) = (req.client, req.seq);
        let &(wanted, to) = self.awaiting.get(&client)?;
        if wanted != seq {
            return None;
        }
        let msg = match self.sessions.get(&client) {
            Some(s) if s.seq == seq => s.outcome.message(client, seq),
            // The client moved on: a later request of its was decided.
            Some(s) if s.seq > seq => return None,
            _ => self.past_deadline(client, seq, req.deadline_ms),
        };
        self.awaiting.remove(&client);
        Some((to, msg))
    }

    /// The log finally delivered `decided` at log time `time` with `outcome` (after
    /// [`ClientTable::sweep`] at `time`): the client's session takes it. Returns whom to
    /// tell, if a sender waits here for it.
    pub(super) fn record(
        &mut self,
        decided: Decided,
        time: u64,
        outcome: Last,
    ) -> Option<(Addr, OrderMsg)> {
        let Decided {
            client,
            seq,
            deadline,
            ..
        } = decided;
        let end = self.session_end(deadline);
        // The common case: a request that ran, of a client whose session lives on.
        if outcome != Last::Expired {
            if let Some(o) = self.sessions.get_mut(&client).filter(|o| o.until >= time) {
                let tell = tell(&mut self.awaiting, client, seq, &outcome);
                Self::extend(&mut self.ending, client, o, seq, end, outcome);
                return tell;
            }
        }
        // A session that ended (a sweep at `time` would have forgotten it) is forgotten
        // first: whether it ran this request is then its bucket's to tell.
        if let Some(o) = self.sessions.remove(&client) {
            if o.until < time {
                self.ending.remove(&(ending_step(o.until), client));
                self.forgot(client, &o);
            } else {
                self.sessions.insert(client, o);
            }
        }
        // An expired request the live session (if any) had not reached (it was not
        // dropped): whether it ran in an earlier session may not be known.
        let outcome = match outcome {
            Last::Expired => match self.past_deadline(client, seq, deadline) {
                OrderMsg::Unknown { .. } => Last::Unknown,
                _ => Last::Expired,
            },
            other => other,
        };
        let tell = tell(&mut self.awaiting, client, seq, &outcome);
        if let Some(o) = self.sessions.get_mut(&client) {
            Self::extend(&mut self.ending, client, o, seq, end, outcome);
        } else if let Some(span) = Span::after(None, seq, end, time) {
            self.ending.insert((ending_step(span.until), client));
            let session = Session {
                seq: span.last,
                outcome,
                until: span.until,
                since: time,
            };
            self.sessions.insert(client, session);
        }
        tell
    }

    /// Live session `o` of `client` takes request `seq`, which keeps it until `end`, with
    /// `outcome`; its entry in `ending` moves only when its end crosses into another step.
    fn extend(
        ending: &mut BTreeSet<(u64, u64)>,
        client: u64,
        o: &mut Session,
        seq: u64,
        end: u64,
        outcome: Last,
    ) {
        if seq > o.seq {
            o.seq = seq;
            o.outcome = outcome;
        }
        let until = o.until.max(end);
        if ending_step(until) != ending_step(o.until) {
            ending.remove(&(ending_step(o.until), client));
            ending.insert((ending_step(until), client));
        }
        o.until = until;
    }

    /// Decides a batch's requests at its entry, where the log's time is `time`, in the batch's
    /// order. A request whose client's session lives at `time` (as the final table and the
    /// entries `ahead` of it leave it) and already holds its number or a higher one is a
    /// duplicate, or older than a request already ordered, and is dropped. Of the others, one
    /// whose deadline is before `time` expires; the rest are admitted. Both count as
    /// delivered (`ahead` takes them). The tables hold exactly what the entries before this
    /// one delivered and `time` is the log's, so the verdict is a function of the log prefix
    /// alone: the same on every replica and every replay of a log, however a client's numbers
    /// arrive, and whenever a replica sweeps.
    pub(super) fn admit(&self, batch: &[Request], time: u64, ahead: &mut Ahead) -> Admission {
        let mut admission = Admission::default();
        for r in batch {
            let before = ahead.span(self, r.client);
            if Span::live_last(before, time).is_some_and(|last| r.seq <= last) {
                continue;
            }
            let d = Decided {
                client: r.client,
                seq: r.seq,
                deadline: r.deadline_ms,
                runs: r.deadline_ms >= time,
            };
            ahead.note(self, d, before, time);
            admission.decided.push(d);
            if d.runs {
                admission.admitted.push(r.clone());
            }
        }
        admission
    }
}

/// Whom to tell `outcome` of request `seq` of `client`, if its sender waits here for it (it
/// then no longer waits).
fn tell(
    awaiting: &mut FxHashMap<u64, (u64, Addr)>,
    client: u64,
    seq: u64,
    outcome: &Last,
) -> Option<(Addr, OrderMsg)> {
    match awaiting.get(&client) {
        Some(&(wanted, to)) if wanted == seq => {
            awaiting.remove(&client);
            Some((to, outcome.message(client, seq)))
        }
        _ => None,
    }
}

/// Sessions are indexed by when they end in steps of this many milliseconds of log time: a
/// session's index entry moves only when its end crosses into another step (not with every
/// request), and a sweep forgets it once the whole step is past, up to a step after its end.
pub(super) const ENDING_STEP_MS: u64 = 1024;

/// The step of ends that `until` falls in.
fn ending_step(until: u64) -> u64 {
    until / ENDING_STEP_MS
}

/// How many buckets the clients fall in for what the table remembers of forgotten sessions.
pub(super) const BUCKETS: u16 = 4096;

/// The bucket of `client`: its id mixed (SplitMix64's finalizer), so that a node's clients,
/// numbered from one base, spread over every bucket.
pub(super) fn bucket(client: u64) -> u16 {
    let mut z = client.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(BUCKETS)) as u16
}

#[cfg(test)]
mod tests;
