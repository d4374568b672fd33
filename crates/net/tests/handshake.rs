//! The Noise handshake between two sides, driven by hand over real frames, and the sealed
//! records that follow it.

use atomos_net::frame::{self, Decoder, DEFAULT_MAX_FRAME};
use atomos_net::handshake::{
    Handshake, Identity, IdentityError, Preamble, Progress, Refusal, Role, MAX_CLUSTER_NAME,
};
use atomos_net::secure::{Opener, SealError, Sealer, MAX_PLAIN};
use atomos_net::wire::WIRE_VERSION;

const KEY: &str = "a cluster secret of thirty-two bytes!";

fn id(cluster: &str, node: u64, secret: &str) -> Identity {
    Identity::new(cluster, node, secret).unwrap()
}

/// The frames' payloads in `bytes`.
fn frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut d = Decoder::new(DEFAULT_MAX_FRAME);
    d.push(bytes);
    let mut out = Vec::new();
    while let Some(f) = d.next_frame().unwrap() {
        out.push(f.to_vec());
    }
    assert_eq!(d.finish(), Ok(()));
    out
}

type Ended = Result<(u64, Sealer, Opener), Refusal>;

/// One side, with what it received and how it ended.
struct Side {
    hs: Handshake,
    ended: Option<Ended>,
    /// Every frame it sent, in order.
    sent: Vec<Vec<u8>>,
}

impl Side {
    fn feed(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        if self.ended.is_some() {
            return;
        }
        match self.hs.step(payload, out) {
            Ok(Progress::Pending) => {}
            Ok(Progress::Established {
                peer,
                sealer,
                opener,
            }) => self.ended = Some(Ok((peer, sealer, opener))),
            Err(e) => self.ended = Some(Err(e)),
        }
    }
}

/// Runs the dialler `i` and the acceptor `r` until neither has anything more to say.
fn connect(i: Identity, r: Identity) -> (Side, Side) {
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut si = Side {
        hs: Handshake::start(i, Role::Initiator, &mut to_r),
        ended: None,
        sent: Vec::new(),
    };
    let mut sr = Side {
        hs: Handshake::start(r, Role::Responder, &mut to_i),
        ended: None,
        sent: Vec::new(),
    };
    while !to_r.is_empty() || !to_i.is_empty() {
        let (for_r, for_i) = (
            frames(&std::mem::take(&mut to_r)),
            frames(&std::mem::take(&mut to_i)),
        );
        for f in &for_r {
            sr.feed(f, &mut to_i);
        }
        for f in &for_i {
            si.feed(f, &mut to_r);
        }
        si.sent.extend(for_r);
        sr.sent.extend(for_i);
    }
    (si, sr)
}

fn established(side: Side) -> (u64, Sealer, Opener) {
    match side.ended {
        Some(Ok(done)) => done,
        other => panic!("not established: {other:?}"),
    }
}

fn refusal(side: &Side) -> Refusal {
    match &side.ended {
        Some(Err(e)) => e.clone(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn same_cluster_and_secret_establish_a_sealed_channel() {
    let (i, r) = connect(id("prod", 1, KEY), id("prod", 2, KEY));
    let (peer_of_i, mut seal_i, mut open_i) = established(i);
    let (peer_of_r, mut seal_r, mut open_r) = established(r);
    assert_eq!((peer_of_i, peer_of_r), (2, 1));

    // Both directions carry any amount, split into records no larger than Noise allows.
    for (sealer, opener) in [(&mut seal_i, &mut open_r), (&mut seal_r, &mut open_i)] {
        let plain: Vec<u8> = (0..3 * MAX_PLAIN + 5).map(|n| n as u8).collect();
        let mut wire = Vec::new();
        sealer.seal(&plain, &mut wire).unwrap();
        let mut opened = Vec::new();
        for record in frames(&wire) {
            opener.open(&record, &mut opened).unwrap();
        }
        assert_eq!(opened, plain);
        assert!(
            !wire.windows(64).any(|w| w == &plain[1000..1064]),
            "sealed, not plain"
        );
    }
}

/// Three records from `sealer`, as the peer would receive them.
fn three_records(sealer: &mut Sealer) -> Vec<Vec<u8>> {
    let mut wire = Vec::new();
    for text in [&b"first"[..], b"second", b"third"] {
        sealer.seal(text, &mut wire).unwrap();
    }
    frames(&wire)
}

#[test]
fn tampered_replayed_reordered_and_injected_records_do_not_open() {
    type Mangle = fn(&mut Vec<Vec<u8>>);
    let cases: [(&str, Mangle); 5] = [
        ("flipped bit", |r| r[1][3] ^= 0x10),
        ("replayed", |r| r[1] = r[0].clone()),
        ("reordered", |r| r.swap(1, 2)),
        ("dropped", |r| drop(r.remove(1))),
        ("injected", |r| r.insert(1, vec![0x55; 40])),
    ];
    for (what, mangle) in cases {
        let (i, r) = connect(id("c", 1, KEY), id("c", 2, KEY));
        let (_, mut sealer, _) = established(i);
        let (_, _, mut opener) = established(r);
        let mut records = three_records(&mut sealer);
        mangle(&mut records);
        let mut opened = Vec::new();
        opener.open(&records[0], &mut opened).unwrap();
        let err = opener.open(&records[1], &mut opened);
        assert!(
            matches!(err, Err(SealError::Tampered { .. })),
            "{what}: {err:?}"
        );
        assert_eq!(
            opened, b"first",
            "{what}: nothing of a bad record is delivered"
        );
        // A failed opener stays failed, even for a record that would open in its place.
        for record in &records[1..] {
            assert!(opener.open(record, &mut opened).is_err(), "{what}");
        }
        assert_eq!(opened, b"first", "{what}");
    }
}

#[test]
fn a_wrong_secret_is_refused_before_the_acceptor_proves_anything() {
    let (i, r) = connect(
        id("prod", 1, KEY),
        id("prod", 2, "another secret of 32 bytes or so"),
    );
    assert_eq!(refusal(&r), Refusal::BadProof);
    // The acceptor sent its preamble only: nothing that depends on the secret.
    assert_eq!(r.sent.len(), 1);
    assert!(i.ended.is_none(), "the dialler waits until its deadline");
}

#[test]
fn another_cluster_or_wire_version_is_refused_clearly() {
    let (i, r) = connect(id("prod", 1, KEY), id("staging", 2, KEY));
    assert!(matches!(refusal(&i), Refusal::WrongCluster { .. }));
    assert!(matches!(refusal(&r), Refusal::WrongCluster { .. }));

    let mut out = Vec::new();
    let mut h = Handshake::start(id("prod", 1, KEY), Role::Responder, &mut out);
    let preamble = Preamble {
        wire_version: WIRE_VERSION + 1,
        cluster: "prod".into(),
    };
    let err = h.step(&postcard::to_stdvec(&preamble).unwrap(), &mut out);
    assert_eq!(
        err.unwrap_err(),
        Refusal::Version {
            ours: WIRE_VERSION,
            theirs: WIRE_VERSION + 1
        }
    );
}

#[test]
fn a_replayed_first_message_establishes_nothing() {
    // A recorded dialler's preamble and first message, replayed to a new acceptor: it answers,
    // but without the dialler's ephemeral key nobody can confirm, and it never counts the
    // dialler as authenticated.
    let (i, _) = connect(id("c", 1, KEY), id("c", 2, KEY));
    let recorded = i.sent.clone();
    assert_eq!(recorded.len(), 3, "preamble, first message, confirmation");
    let mut out = Vec::new();
    let mut replayed = Handshake::start(id("c", 2, KEY), Role::Responder, &mut out);
    assert!(matches!(
        replayed.step(&recorded[0], &mut out),
        Ok(Progress::Pending)
    ));
    assert!(matches!(
        replayed.step(&recorded[1], &mut out),
        Ok(Progress::Pending)
    ));
    assert_eq!(
        replayed.step(&recorded[2], &mut out).unwrap_err(),
        Refusal::BadProof
    );
}

#[test]
fn tampered_preambles_self_connections_and_late_messages_are_refused() {
    // A preamble changed on the way (same cluster and version, other bytes) breaks the
    // handshake: both preambles are bound into it.
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut hi = Handshake::start(id("c", 1, KEY), Role::Initiator, &mut to_r);
    let mut hr = Handshake::start(id("c", 2, KEY), Role::Responder, &mut to_i);
    let mut preamble_of_r = frames(&to_i).remove(0);
    preamble_of_r.push(0); // trailing byte: postcard ignores it, the prologue does not
    let mut first = Vec::new();
    hi.step(&preamble_of_r, &mut first).unwrap();
    hr.step(&frames(&to_r)[0], &mut Vec::new()).unwrap();
    let first = frames(&first);
    assert_eq!(
        hr.step(&first[0], &mut Vec::new()).unwrap_err(),
        Refusal::BadProof
    );
    // Refused once, refused for good.
    assert!(hr.step(&first[0], &mut Vec::new()).is_err());

    let (i, r) = connect(id("c", 1, KEY), id("c", 1, KEY));
    assert_eq!(refusal(&r), Refusal::SameNode(1));
    assert!(i.ended.is_none());

    let mut out = Vec::new();
    let mut h = Handshake::start(id("c", 1, KEY), Role::Responder, &mut out);
    assert!(matches!(
        h.step(&[0xff; 8], &mut out),
        Err(Refusal::Malformed(_))
    ));
}

#[test]
fn bad_identities_are_configuration_errors() {
    assert_eq!(
        Identity::new("c", 1, "").unwrap_err(),
        IdentityError::EmptySecret
    );
    assert_eq!(
        Identity::new("", 1, "k").unwrap_err(),
        IdentityError::EmptyCluster
    );
    let long = "x".repeat(MAX_CLUSTER_NAME + 1);
    assert_eq!(
        Identity::new(long.as_str(), 1, "k").unwrap_err(),
        IdentityError::LongCluster(MAX_CLUSTER_NAME + 1)
    );
    // The longest name still fits a handshake frame.
    let mut out = Vec::new();
    let _ = Handshake::start(
        id(&"y".repeat(MAX_CLUSTER_NAME), 1, KEY),
        Role::Initiator,
        &mut out,
    );
    assert_eq!(frames(&out).len(), 1);
    assert!(out.len() <= frame::PREFIX + atomos_net::handshake::MAX_HANDSHAKE_FRAME);
    assert!(
        !format!("{:?}", id("c", 1, "topsecret")).contains("topsecret"),
        "Debug hides the secret"
    );
}

#[test]
fn a_dialler_reaching_another_node_refuses_it_before_confirming() {
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut dialler = Handshake::start(id("c", 1, KEY), Role::Initiator, &mut to_r);
    dialler.expect_peer(2);
    let mut other = Handshake::start(id("c", 3, KEY), Role::Responder, &mut to_i);
    let mut refused = None;
    let mut sent_after_refusal = false;
    while !to_r.is_empty() || !to_i.is_empty() {
        for f in frames(&std::mem::take(&mut to_r)) {
            let _ = other.step(&f, &mut to_i);
        }
        for f in frames(&std::mem::take(&mut to_i)) {
            let before = to_r.len();
            if let Err(e) = dialler.step(&f, &mut to_r) {
                refused = Some(e);
                sent_after_refusal |= to_r.len() > before;
            }
        }
    }
    assert_eq!(
        refused,
        Some(Refusal::UnexpectedPeer {
            expected: 2,
            found: 3
        })
    );
    assert!(!sent_after_refusal, "node 3 was sent no confirmation");
}
