use super::*;
use crate::types::StreamHeader;

const SENDER: Addr = 1;
const RECEIVER: Addr = 2;

fn limits() -> StreamLimits {
    StreamLimits {
        chunk_bytes: 7,
        window: 3,
        retry_ticks: 2,
        give_up_ticks: 240,
        max_bytes: 10_000,
    }
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

/// A link between one sender and one receiver that loses, repeats and reorders messages
/// by a seeded generator.
struct Link {
    senders: Senders,
    receivers: Receivers,
    queue: Vec<(Addr, Addr, OrderMsg)>,
    rng: u64,
    loss: u64,
    now: u64,
    sent: Vec<Sent>,
    received: Vec<Received>,
    /// The most chunks past the acknowledged bytes seen in flight at once.
    most_ahead: u64,
    /// Chunks the sender sent.
    chunks_sent: u64,
}

impl Link {
    fn new(seed: u64, loss_percent: u64) -> Link {
        Link {
            senders: Senders::new(limits(), 100),
            receivers: Receivers::new(limits()),
            queue: Vec::new(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            loss: loss_percent,
            now: 0,
            sent: Vec::new(),
            received: Vec::new(),
            most_ahead: 0,
            chunks_sent: 0,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn push(&mut self, from: Addr, msgs: Vec<(Addr, OrderMsg)>) {
        for (to, msg) in msgs {
            if let OrderMsg::StreamChunk { data, .. } = &msg {
                assert!(data.len() <= limits().chunk_bytes, "a chunk past the limit");
                self.chunks_sent += 1;
            }
            if self.next() % 100 < self.loss {
                continue;
            }
            if self.next() % 100 < self.loss {
                self.queue.push((from, to, msg.clone()));
            }
            self.queue.push((from, to, msg));
        }
    }

    fn start(&mut self, data: Vec<u8>) {
        let data = Bytes::from(data);
        let mut msgs = Vec::new();
        let replaced = self.senders.start(
            self.now,
            RECEIVER,
            StreamKind::State(StreamHeader::default()),
            data.into(),
            &mut msgs,
        );
        self.sent.extend(replaced);
        self.push(SENDER, msgs);
    }

    /// Delivers one queued message (a random one when the link reorders).
    fn deliver_one(&mut self) -> bool {
        if self.queue.is_empty() {
            return false;
        }
        let i = if self.loss > 0 {
            (self.next() % self.queue.len() as u64) as usize
        } else {
            0
        };
        let (from, to, msg) = self.queue.remove(i);
        let mut msgs = Vec::new();
        let now = self.now;
        match msg {
            OrderMsg::StreamRefused { stream, reason } => {
                self.senders.on_refused(now, from, stream, reason);
            }
            OrderMsg::StreamOffer {
                stream,
                kind,
                total,
                checksum,
            } => {
                let r = self.receivers.on_offer(
                    now,
                    from,
                    Offer {
                        stream,
                        kind,
                        total,
                        checksum,
                    },
                    &mut msgs,
                );
                self.received.push(r);
            }
            OrderMsg::StreamChunk {
                stream,
                offset,
                data,
            } => {
                let r = self
                    .receivers
                    .on_chunk(now, from, stream, offset, &data, &mut msgs);
                self.received.push(r);
            }
            OrderMsg::StreamAck { stream, next } => {
                let ended = self.senders.on_ack(now, from, stream, next, &mut msgs);
                self.sent.extend(ended);
            }
            other => panic!("not a stream message: {other:?}"),
        }
        let chunks_out = self
            .queue
            .iter()
            .filter(|(_, _, m)| matches!(m, OrderMsg::StreamChunk { .. }))
            .count() as u64;
        self.most_ahead = self.most_ahead.max(chunks_out);
        self.push(to, msgs);
        true
    }

    fn tick(&mut self) {
        self.now += 1;
        let mut msgs = Vec::new();
        let ended = self.senders.tick(self.now, &mut msgs);
        self.sent.extend(ended);
        self.receivers.tick(self.now);
        self.push(SENDER, msgs);
    }

    /// Runs until nothing is queued and the sender is done, or `ticks` pass.
    fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            for _ in 0..50 {
                if !self.deliver_one() {
                    break;
                }
            }
            if self.queue.is_empty() && !self.senders.sending_to(RECEIVER) {
                return;
            }
            self.tick();
        }
    }

    fn completed(&self) -> Vec<&Vec<u8>> {
        self.received
            .iter()
            .filter_map(|r| match r {
                Received::Complete { data, .. } => Some(data),
                _ => None,
            })
            .collect()
    }
}

/// Both ends report how far a stream has come while it travels, and the bytes moved once
/// it is done, each byte counted once however often the lossy link repeats it.
#[test]
fn both_ends_report_a_streams_progress_and_count_each_byte_once() {
    let mut link = Link::new(3, 20);
    let data = bytes(100);
    link.start(data.clone());
    let sending = link.senders.progress();
    assert_eq!((sending.streams, sending.done, sending.total), (1, 0, 100));
    let mut seen_midway = false;
    for _ in 0..2000 {
        if !link.deliver_one() {
            link.tick();
        }
        let receiving = link.receivers.progress();
        let sending = link.senders.progress();
        assert!(sending.done <= receiving.done || receiving.streams == 0);
        seen_midway |= receiving.done > 0 && receiving.done < receiving.total;
        if !link.senders.sending_to(RECEIVER) {
            break;
        }
    }
    assert!(seen_midway, "the receiver reported a stream half there");
    assert_eq!(link.completed(), vec![&data]);
    let (sending, receiving) = (link.senders.progress(), link.receivers.progress());
    assert_eq!((sending.streams, sending.done, sending.total), (0, 0, 0));
    assert_eq!((receiving.streams, receiving.done), (0, 0));
    assert_eq!((sending.moved, receiving.moved), (100, 100));
}

#[test]
fn a_stream_arrives_whole_in_chunks_a_window_at_a_time() {
    let mut link = Link::new(1, 0);
    let data = bytes(100);
    link.start(data.clone());
    link.run(100);
    assert_eq!(link.completed(), vec![&data]);
    assert_eq!(
        link.sent,
        vec![Sent::Delivered {
            to: RECEIVER,
            kind: StreamKind::State(StreamHeader::default())
        }]
    );
    assert!(
        link.most_ahead <= limits().window as u64,
        "{}",
        link.most_ahead
    );
    // Nothing is sent twice on a link that loses nothing (an acknowledgement of a copy once
    // looked like a gap and sent a copy of the next chunk, a quarter more in all).
    assert_eq!(
        link.chunks_sent,
        100u64.div_ceil(limits().chunk_bytes as u64)
    );
    assert_eq!(link.receivers.held_bytes(), 0);
    // An empty snapshot is a stream too.
    let mut link = Link::new(2, 0);
    link.start(Vec::new());
    link.run(10);
    assert_eq!(link.completed(), vec![&Vec::new()]);
}

#[test]
fn loss_repeats_and_reordering_delay_a_stream_but_it_arrives_once_and_whole() {
    for seed in 0..300 {
        let mut link = Link::new(seed, 30);
        let data = bytes(50 + (seed as usize * 13) % 400);
        link.start(data.clone());
        link.run(2_000);
        assert_eq!(
            link.completed(),
            vec![&data],
            "seed {seed}: {:?} at {}",
            link.sent,
            link.now
        );
        let delivered = link
            .sent
            .iter()
            .filter(|s| matches!(s, Sent::Delivered { .. }))
            .count();
        assert_eq!(delivered, 1, "seed {seed}: {:?}", link.sent);
    }
}

#[test]
fn a_receiver_that_lost_what_it_held_gets_the_stream_again_from_the_start() {
    let mut link = Link::new(3, 0);
    let data = bytes(200);
    link.start(data.clone());
    for _ in 0..6 {
        link.deliver_one();
    }
    assert!(link.receivers.held_bytes() > 0);
    // The receiving replica restarts: it holds nothing of the stream.
    link.receivers = Receivers::new(limits());
    link.run(200);
    assert_eq!(link.completed(), vec![&data]);
}

#[test]
fn a_chunk_changed_on_the_way_fails_the_checksum_and_the_stream_starts_over() {
    let mut link = Link::new(4, 0);
    let data = bytes(30);
    link.start(data.clone());
    if let Some((_, _, OrderMsg::StreamChunk { data, .. })) = link.queue.get_mut(1) {
        data[0] ^= 0xFF;
    }
    link.run(200);
    assert!(
        link.received
            .iter()
            .any(|r| matches!(r, Received::Corrupt(why) if why.contains("checksum"))),
        "{:?}",
        link.received
    );
    assert_eq!(link.completed(), vec![&data]);
}

#[test]
fn a_silent_receiver_is_given_up_on_and_a_silent_sender_forgotten() {
    let mut link = Link::new(5, 0);
    link.start(bytes(100));
    link.queue.clear();
    for _ in 0..limits().give_up_ticks + 1 {
        link.queue.clear();
        link.tick();
    }
    assert_eq!(
        link.sent,
        vec![Sent::Abandoned {
            to: RECEIVER,
            kind: StreamKind::State(StreamHeader::default())
        }]
    );
    assert!(!link.senders.sending_to(RECEIVER));

    let mut link = Link::new(6, 0);
    link.start(bytes(100));
    for _ in 0..3 {
        link.deliver_one();
    }
    let held = link.receivers.held_bytes();
    assert!(held > 0);
    link.queue.clear();
    link.senders = Senders::new(limits(), 500);
    for _ in 0..limits().give_up_ticks + 1 {
        link.tick();
    }
    assert_eq!(
        link.receivers.held_bytes(),
        0,
        "the memory of a dead stream is freed"
    );
}

#[test]
fn a_newer_stream_replaces_an_older_and_a_stream_too_large_is_refused() {
    let mut link = Link::new(7, 0);
    link.start(bytes(100));
    for _ in 0..2 {
        link.deliver_one();
    }
    let newer = bytes(60).into_iter().rev().collect::<Vec<u8>>();
    link.start(newer.clone());
    link.run(200);
    assert_eq!(link.completed(), vec![&newer]);
    assert_eq!(
        link.sent[0],
        Sent::Abandoned {
            to: RECEIVER,
            kind: StreamKind::State(StreamHeader::default())
        }
    );

    let mut receivers = Receivers::new(limits());
    let mut msgs = Vec::new();
    let offer = |stream, total, checksum| Offer {
        stream,
        kind: StreamKind::State(StreamHeader::default()),
        total,
        checksum,
    };
    let r = receivers.on_offer(0, SENDER, offer(1, 10_001, 0), &mut msgs);
    assert!(matches!(r, Received::Refused(why) if why.contains("10001 bytes")));
    assert!(
        matches!(&msgs[..], [(SENDER, OrderMsg::StreamRefused { stream: 1, reason })] if reason.contains("snapshot_max_bytes")),
        "{msgs:?}"
    );
    assert_eq!(receivers.held_bytes(), 0);
    // The same offer again is refused again, but reported once per give-up period.
    msgs.clear();
    let again = receivers.on_offer(1, SENDER, offer(1, 10_001, 0), &mut msgs);
    assert_eq!((again, msgs.len()), (Received::Nothing, 1));
    msgs.clear();
    // Chunks past the offered size, or of no offered stream, are not kept.
    receivers.on_offer(0, SENDER, offer(2, 4, checksum(b"abcd")), &mut msgs);
    assert_eq!(
        receivers.on_chunk(0, SENDER, 2, 0, b"abcde", &mut msgs),
        Received::Nothing
    );
    assert_eq!(
        receivers.on_chunk(0, SENDER, 9, 0, b"abcd", &mut msgs),
        Received::Nothing
    );
    assert_eq!(receivers.held_bytes(), 0);
    assert_eq!(
        receivers.on_chunk(0, SENDER, 2, 0, b"abcd", &mut msgs),
        Received::Complete {
            kind: StreamKind::State(StreamHeader::default()),
            data: b"abcd".to_vec()
        }
    );
    // Its offer again (the sender missed the last acknowledgement) is answered, not taken.
    msgs.clear();
    let again = receivers.on_offer(0, SENDER, offer(2, 4, 0), &mut msgs);
    assert_eq!(again, Received::Nothing);
    assert_eq!(
        msgs,
        vec![(SENDER, OrderMsg::StreamAck { stream: 2, next: 4 })]
    );
}

/// Seed 0 and 143 of the order simulation: a replica restarted and numbered its streams from
/// 1 again, and its receiver, holding a higher number of its earlier start, ignored every new
/// offer (or answered it with what it had completed of the old one): the lagging replica never
/// caught up. Any other number now replaces the stream held, and numbers start at random.
#[test]
fn a_restarted_senders_stream_is_taken_whatever_it_is_numbered() {
    let mut link = Link::new(8, 0);
    link.start(bytes(100));
    for _ in 0..4 {
        link.deliver_one();
    }
    assert!(link.receivers.held_bytes() > 0);
    // The sender restarts, numbering from below what the receiver holds.
    link.queue.clear();
    link.senders = Senders::new(limits(), 1);
    let data = bytes(90);
    link.start(data.clone());
    link.run(200);
    assert_eq!(link.completed(), vec![&data]);
}

#[test]
fn a_refused_stream_sends_nothing_more_and_ends_after_the_give_up_wait() {
    let mut link = Link::new(9, 0);
    link.receivers = Receivers::new(StreamLimits {
        max_bytes: 50,
        ..limits()
    });
    link.start(bytes(100));
    link.deliver_one();
    assert!(
        matches!(&link.received[..], [Received::Refused(_)]),
        "{:?}",
        link.received
    );
    // The refusal reaches the sender; the chunks sent with the offer are let go.
    while link.deliver_one() {}
    for _ in 0..limits().give_up_ticks - 1 {
        link.tick();
        assert!(
            link.queue.is_empty(),
            "sent after the refusal: {:?}",
            link.queue
        );
    }
    assert!(link.sent.is_empty());
    link.tick();
    assert!(
        matches!(&link.sent[..], [Sent::Refused { reason, .. }] if reason.contains("100 bytes")),
        "{:?}",
        link.sent
    );
}

#[test]
fn re_sends_without_progress_wait_twice_as_long_each_time() {
    let mut link = Link::new(10, 0);
    link.start(bytes(100));
    let mut offers_at = Vec::new();
    for _ in 0..limits().give_up_ticks + 1 {
        // Everything the receiver would answer is lost: only the sender's re-sends count.
        link.queue.clear();
        link.tick();
        if link
            .queue
            .iter()
            .any(|(_, _, m)| matches!(m, OrderMsg::StreamOffer { .. }))
        {
            offers_at.push(link.now);
        }
    }
    let r = limits().retry_ticks;
    assert_eq!(
        offers_at[..5],
        [r, 3 * r, 7 * r, 15 * r, 23 * r],
        "re-sent after r, 2r, 4r, then every 8r of silence"
    );
    assert!(offers_at.windows(2).all(|w| w[1] - w[0] <= 8 * r));
    assert!(
        matches!(&link.sent[..], [Sent::Abandoned { .. }]),
        "{:?}",
        link.sent
    );
}

/// A chunk lost before others that arrive: the receiver repeats what it holds, and the sender
/// sends that one chunk again at once instead of waiting for its timer (on a 64 MiB transfer
/// over TCP, waiting for the timer at every gap took 76 to 90 s where this takes 11).
#[test]
fn a_gap_is_filled_at_once_without_waiting_for_the_timer() {
    let mut link = Link::new(11, 0);
    let data = bytes(100);
    link.start(data.clone());
    let lost = link
        .queue
        .iter()
        .position(|(_, _, m)| matches!(m, OrderMsg::StreamChunk { offset: 7, .. }))
        .expect("the second chunk is out");
    link.queue.remove(lost);
    while link.deliver_one() {}
    assert_eq!(link.now, 0, "no tick passed");
    assert_eq!(link.completed(), vec![&data]);
}

/// A receiver that answers every offer but never takes a chunk (its frame limit is smaller
/// than the sender's chunks, say): the stream still ends, after four give-up periods without
/// progress, instead of keeping Raft waiting for good.
#[test]
fn a_stream_that_never_progresses_ends_though_the_receiver_answers() {
    let mut link = Link::new(12, 0);
    link.start(bytes(100));
    let limit = 4 * limits().give_up_ticks;
    while link.now <= limit && link.sent.is_empty() {
        link.queue
            .retain(|(_, _, m)| !matches!(m, OrderMsg::StreamChunk { .. }));
        while link.deliver_one() {
            link.queue
                .retain(|(_, _, m)| !matches!(m, OrderMsg::StreamChunk { .. }));
        }
        link.tick();
    }
    assert!(
        matches!(&link.sent[..], [Sent::Abandoned { .. }]),
        "{:?}",
        link.sent
    );
    assert!(
        link.now > limits().give_up_ticks,
        "not for silence: it answered"
    );
}

/// A stream of several parts reads as their bytes joined: its size, its checksum and every
/// range, including ranges that span a part's end or skip an empty part.
#[test]
fn a_stream_of_parts_reads_as_the_parts_joined() {
    let a = bytes(10);
    let b = Vec::new();
    let c: Vec<u8> = (0..7u8).map(|x| x + 100).collect();
    let joined = [a.clone(), b.clone(), c.clone()].concat();
    let parts = Parts::new([a, b, c].map(Bytes::from));
    assert_eq!(parts.len(), joined.len() as u64);
    assert_eq!(parts.checksum(), checksum(&joined));
    for from in 0..=joined.len() {
        for to in from..=joined.len() {
            assert_eq!(
                parts.copy(from as u64, to as u64),
                joined[from..to].to_vec()
            );
        }
    }
}
