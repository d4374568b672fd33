//! The Noise handshake between two sides, driven by hand over real frames, and the sealed
//! records that follow it.

use std::sync::Arc;

use atomos_net::frame::{self, Decoder, DEFAULT_MAX_FRAME};
use atomos_net::handshake::{
    Handshake, Identity, IdentityError, Preamble, Progress, Refusal, Speaks, MAX_CLUSTER_NAME,
};
use atomos_net::keys::KeyPair;
use atomos_net::roster::{Rejection, Roster};
use atomos_net::secure::{Opener, SealError, Sealer, MAX_PLAIN};
use atomos_net::transport::{is_client, CLIENT_BIT};
use atomos_net::wire::{OLDEST_WIRE_VERSION, WIRE_VERSION};

const KEY: &str = "a cluster secret of thirty-two bytes!";

fn key_from(label: u8, n: u64) -> KeyPair {
    let mut private = [label; 32];
    private[..8].copy_from_slice(&n.to_be_bytes());
    KeyPair::from_private(private).unwrap()
}

fn member_key(node: u64) -> KeyPair {
    key_from(b'm', node)
}

fn client_key(n: u64) -> KeyPair {
    key_from(b'c', n)
}

/// Members 1 to 3 and clients 1 and 2 ("client-1", "client-2").
fn roster() -> Arc<Roster> {
    Arc::new(Roster::new(
        (1..=3).map(|n| (n, vec![member_key(n).public()])),
        (1..=2).map(|n| (client_key(n).public(), format!("client-{n}"))),
    ))
}

/// Member `node` of `cluster` with `secret`, holding its own key.
fn id(cluster: &str, node: u64, secret: &str) -> Identity {
    Identity::member(cluster, node, secret, member_key(node)).unwrap()
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
    /// The wire version the connection speaks, once established.
    version: Option<u16>,
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
                version,
                sealer,
                opener,
                ..
            }) => {
                self.version = Some(version);
                self.ended = Some(Ok((peer, sealer, opener)))
            }
            Err(e) => self.ended = Some(Err(e)),
        }
    }
}

/// Runs the dialler `i` and the acceptor `r` until neither has anything more to say; the
/// dialler means to reach `r`'s member id.
fn connect(i: Identity, r: Identity) -> (Side, Side) {
    let to = r.node();
    connect_with(i, roster(), r, roster(), to)
}

/// [`connect`] with rosters of each side's own, the dialler meaning to reach member `to`.
fn connect_with(
    i: Identity,
    roster_i: Arc<Roster>,
    r: Identity,
    roster_r: Arc<Roster>,
    to: u64,
) -> (Side, Side) {
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut si = Side {
        hs: Handshake::dial(i, roster_i, to, &mut to_r),
        ended: None,
        sent: Vec::new(),
        version: None,
    };
    let mut sr = Side {
        hs: Handshake::accept(r, roster_r, &mut to_i),
        ended: None,
        sent: Vec::new(),
        version: None,
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
    let mut h = Handshake::accept(id("prod", 1, KEY), roster(), &mut out);
    let preamble = Preamble {
        oldest: WIRE_VERSION + 1,
        cluster: "prod".into(),
        newest: WIRE_VERSION + 2,
    };
    let err = h.step(&postcard::to_stdvec(&preamble).unwrap(), &mut out);
    assert_eq!(
        err.unwrap_err(),
        Refusal::Version {
            ours: Speaks {
                oldest: OLDEST_WIRE_VERSION,
                newest: WIRE_VERSION
            },
            theirs: Speaks {
                oldest: WIRE_VERSION + 1,
                newest: WIRE_VERSION + 2
            }
        }
    );
    // A build that speaks only a version before ours, with the old preamble.
    let mut h = Handshake::accept(id("prod", 1, KEY), roster(), &mut out);
    let old = postcard::to_stdvec(&(OLDEST_WIRE_VERSION - 1, "prod")).unwrap();
    assert!(matches!(
        h.step(&old, &mut out),
        Err(Refusal::Version { .. })
    ));
    // A preamble whose newest version is below its oldest.
    let bad = postcard::to_stdvec(&(WIRE_VERSION, "prod", WIRE_VERSION - 1)).unwrap();
    let mut h = Handshake::accept(id("prod", 1, KEY), roster(), &mut out);
    assert!(matches!(h.step(&bad, &mut out), Err(Refusal::Malformed(_))));
    // Fields a later version appends after `newest` are left unread.
    let later = postcard::to_stdvec(&(OLDEST_WIRE_VERSION, "prod", WIRE_VERSION + 1, 7u8)).unwrap();
    assert_eq!(
        Preamble::decode(&later),
        Ok(Preamble {
            oldest: OLDEST_WIRE_VERSION,
            cluster: "prod".into(),
            newest: WIRE_VERSION + 1
        })
    );
}

#[test]
fn a_connection_speaks_the_newest_version_both_sides_do() {
    let (i, r) = connect(id("c", 1, KEY), id("c", 2, KEY));
    assert_eq!(
        (i.version, r.version),
        (Some(WIRE_VERSION), Some(WIRE_VERSION))
    );
    let old = |node| {
        id("c", node, KEY)
            .speaking_up_to(OLDEST_WIRE_VERSION)
            .unwrap()
    };
    for (dialler, acceptor) in [(old(1), id("c", 2, KEY)), (id("c", 1, KEY), old(2))] {
        let (i, r) = connect(dialler, acceptor);
        assert!(i.ended.as_ref().is_some_and(|e| e.is_ok()));
        assert_eq!(
            (i.version, r.version),
            (Some(OLDEST_WIRE_VERSION), Some(OLDEST_WIRE_VERSION))
        );
    }
    assert_eq!(
        id("c", 1, KEY)
            .speaking_up_to(WIRE_VERSION + 1)
            .unwrap_err(),
        IdentityError::WireVersion(WIRE_VERSION + 1)
    );
}

#[test]
fn the_preamble_reads_as_the_previous_release_expects() {
    // Version 17 builds read `(version, cluster)` with `postcard::from_bytes`, which leaves
    // trailing bytes unread, and refuse a version other than their own.
    let (i, _) = connect(id("c", 1, KEY), id("c", 2, KEY));
    let (first, _): (u16, String) = postcard::from_bytes(&i.sent[0]).unwrap();
    assert_eq!(first, OLDEST_WIRE_VERSION);
    // A side speaking the previous release's version sends its preamble, byte for byte.
    let old = id("c", 1, KEY).speaking_up_to(OLDEST_WIRE_VERSION).unwrap();
    let (i, _) = connect(old, id("c", 2, KEY));
    assert_eq!(
        i.sent[0],
        postcard::to_stdvec(&(OLDEST_WIRE_VERSION, "c")).unwrap()
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
    let mut replayed = Handshake::accept(id("c", 2, KEY), roster(), &mut out);
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
    // A preamble changed on the way (here to push the connection down to an older wire
    // version) breaks the handshake: both preambles are bound into it.
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut hi = Handshake::dial(id("c", 1, KEY), roster(), 2, &mut to_r);
    let mut hr = Handshake::accept(id("c", 2, KEY), roster(), &mut to_i);
    let mut preamble_of_r = Preamble::decode(&frames(&to_i)[0]).unwrap();
    assert_eq!(preamble_of_r.newest, WIRE_VERSION);
    preamble_of_r.newest = OLDEST_WIRE_VERSION;
    let preamble_of_r = postcard::to_stdvec(&preamble_of_r).unwrap();
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
    let mut h = Handshake::accept(id("c", 1, KEY), roster(), &mut out);
    assert!(matches!(
        h.step(&[0xff; 8], &mut out),
        Err(Refusal::Malformed(_))
    ));
}

#[test]
fn bad_identities_are_configuration_errors() {
    assert_eq!(
        Identity::member("c", 1, "", member_key(1)).unwrap_err(),
        IdentityError::EmptySecret
    );
    assert_eq!(
        Identity::member("", 1, "k", member_key(1)).unwrap_err(),
        IdentityError::EmptyCluster
    );
    let long = "x".repeat(MAX_CLUSTER_NAME + 1);
    assert_eq!(
        Identity::member(long.as_str(), 1, "k", member_key(1)).unwrap_err(),
        IdentityError::LongCluster(MAX_CLUSTER_NAME + 1)
    );
    assert_eq!(
        Identity::member("c", CLIENT_BIT | 1, "k", member_key(1)).unwrap_err(),
        IdentityError::ClientBit(CLIENT_BIT | 1)
    );
    assert_eq!(
        Identity::client("c", "", client_key(1)).unwrap_err(),
        IdentityError::EmptySecret
    );
    // The longest name still fits a handshake frame.
    let mut out = Vec::new();
    let _ = Handshake::dial(
        id(&"y".repeat(MAX_CLUSTER_NAME), 1, KEY),
        roster(),
        2,
        &mut out,
    );
    assert_eq!(frames(&out).len(), 1);
    assert!(out.len() <= frame::PREFIX + atomos_net::handshake::MAX_HANDSHAKE_FRAME);
    let shown = format!("{:?}", id("c", 1, "topsecret"));
    assert!(!shown.contains("topsecret"), "Debug hides the secret");
    assert!(
        !shown.contains(member_key(1).private_hex().as_str()),
        "Debug hides the private key"
    );
}

#[test]
fn a_dialler_reaching_another_node_refuses_it_before_confirming() {
    let (mut to_r, mut to_i) = (Vec::new(), Vec::new());
    let mut dialler = Handshake::dial(id("c", 1, KEY), roster(), 2, &mut to_r);
    let mut other = Handshake::accept(id("c", 3, KEY), roster(), &mut to_i);
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

/// Runs the handshake of a dialler holding `key` and claiming member `claimed` with member 1;
/// returns how member 1 ended it.
fn claim_member(claimed: u64, key: KeyPair) -> Refusal {
    let impostor = Identity::member("c", claimed, KEY, key).unwrap();
    let (_, r) = connect_with(impostor, roster(), id("c", 1, KEY), roster(), 1);
    refusal(&r)
}

#[test]
fn a_client_key_claiming_a_member_id_is_refused() {
    assert_eq!(
        claim_member(2, client_key(1)),
        Refusal::Rejected(Rejection::ClientAsMember {
            claimed: 2,
            client: "client-1".into()
        })
    );
}

#[test]
fn a_members_key_claiming_another_members_id_is_refused() {
    assert_eq!(
        claim_member(3, member_key(2)),
        Refusal::Rejected(Rejection::OtherMembersKey {
            claimed: 3,
            holder: 2
        })
    );
}

#[test]
fn unknown_keys_are_refused_as_members_and_as_clients() {
    let stranger = key_from(b's', 9);
    assert_eq!(
        claim_member(2, stranger.clone()),
        Refusal::Rejected(Rejection::WrongMemberKey {
            claimed: 2,
            key: stranger.public().fingerprint()
        })
    );
    assert_eq!(
        claim_member(7, stranger.clone()),
        Refusal::Rejected(Rejection::NotAMember(7))
    );
    let client = Identity::client("c", KEY, stranger.clone()).unwrap();
    let (_, r) = connect(client, id("c", 1, KEY));
    assert_eq!(
        refusal(&r),
        Refusal::Rejected(Rejection::UnknownClient(stranger.public().fingerprint()))
    );
    // A member's key does not pass as a client's either.
    let member_as_client = Identity::client("c", KEY, member_key(2)).unwrap();
    let (_, r) = connect(member_as_client, id("c", 1, KEY));
    assert_eq!(refusal(&r), Refusal::Rejected(Rejection::MemberAsClient(2)));
}

#[test]
fn a_client_is_known_by_the_id_its_key_makes() {
    let client = Identity::client("c", KEY, client_key(2)).unwrap();
    let its_id = client.node();
    assert!(is_client(its_id));
    let (i, r) = connect(client, id("c", 1, KEY));
    assert_eq!(established(r).0, its_id);
    assert_eq!(established(i).0, 1);
    // Every client identity draws a new id; another key never makes this one.
    let again = Identity::client("c", KEY, client_key(2)).unwrap();
    assert_ne!(again.node(), its_id);
}

#[test]
fn a_member_whose_key_rotates_is_admitted_with_either_key_while_both_are_listed() {
    let new_key = key_from(b'n', 2);
    let both = || {
        Arc::new(Roster::new(
            [
                (1, vec![member_key(1).public()]),
                (2, vec![member_key(2).public(), new_key.public()]),
            ],
            [],
        ))
    };
    for key in [member_key(2), new_key.clone()] {
        // As dialler and as acceptor.
        let two = Identity::member("c", 2, KEY, key.clone()).unwrap();
        let (i, r) = connect_with(two.clone(), both(), id("c", 1, KEY), both(), 1);
        assert_eq!((established(i).0, established(r).0), (1, 2));
        let (i, r) = connect_with(id("c", 1, KEY), both(), two, both(), 2);
        assert_eq!((established(i).0, established(r).0), (2, 1));
    }
    // Once the old key is retired, it is refused.
    let retired = both();
    retired.set_member_keys([(2, vec![new_key.public()])]);
    let old = Identity::member("c", 2, KEY, member_key(2)).unwrap();
    let (_, r) = connect_with(old, both(), id("c", 1, KEY), retired, 1);
    assert!(matches!(
        refusal(&r),
        Refusal::Rejected(Rejection::WrongMemberKey { claimed: 2, .. })
    ));
}

#[test]
fn a_dialler_refuses_an_acceptor_without_the_dialled_members_key_before_proving_itself() {
    // Something at member 2's address that knows the secret but not member 2's key.
    let impostor = Identity::member("c", 2, KEY, key_from(b's', 2)).unwrap();
    let (i, r) = connect_with(id("c", 1, KEY), roster(), impostor, roster(), 2);
    assert!(matches!(
        refusal(&i),
        Refusal::Rejected(Rejection::WrongMemberKey { claimed: 2, .. })
    ));
    assert!(
        r.ended.is_none(),
        "the impostor never learns the dialler's key"
    );
    assert_eq!(i.sent.len(), 2, "preamble and first message only");
}
