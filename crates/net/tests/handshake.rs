//! The handshake between two sides, driven by hand, over real encoded frames.

use atomos_net::frame::{Decoder, DEFAULT_MAX_FRAME};
use atomos_net::handshake::{Handshake, HandshakeMsg, Identity, IdentityError, Outcome, Refusal};
use atomos_net::wire::{self, WIRE_VERSION};

fn id(cluster: &str, node: u64, secret: &str) -> Identity {
    Identity::new(cluster, node, secret).unwrap()
}

/// Sends `msg` through the real codec, as a connection would.
fn over_the_wire(msg: &HandshakeMsg) -> HandshakeMsg {
    let mut bytes = Vec::new();
    wire::encode(msg, DEFAULT_MAX_FRAME, &mut bytes).unwrap();
    let mut d = Decoder::new(DEFAULT_MAX_FRAME);
    d.push(&bytes);
    let frame = d.next_frame().unwrap().unwrap().to_vec();
    wire::decode(&frame).unwrap()
}

/// Runs both sides to the end; returns what each side concluded.
fn connect(a: Identity, b: Identity) -> (Result<u64, Refusal>, Result<u64, Refusal>) {
    let (mut ha, hello_a) = Handshake::start(a, [1; 32]);
    let (mut hb, hello_b) = Handshake::start(b, [2; 32]);
    let proof_a = ha.step(over_the_wire(&hello_b));
    let proof_b = hb.step(over_the_wire(&hello_a));
    let finish = |h: &mut Handshake,
                  step: Result<Outcome, Refusal>,
                  peer_proof: &Result<Outcome, Refusal>| {
        let _ = step?;
        match peer_proof {
            Ok(Outcome::Send(p)) => match h.step(over_the_wire(p))? {
                Outcome::Established { peer } => Ok(peer),
                other => panic!("unexpected {other:?}"),
            },
            // The peer refused and sent nothing: this side never learns more.
            _ => Err(Refusal::BadProof),
        }
    };
    let ra = finish(&mut ha, proof_a.clone(), &proof_b);
    let rb = finish(&mut hb, proof_b, &proof_a);
    (ra, rb)
}

#[test]
fn same_cluster_and_secret_establish() {
    let (a, b) = connect(id("prod", 1, "s3cret"), id("prod", 2, "s3cret"));
    assert_eq!((a, b), (Ok(2), Ok(1)));
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides() {
    let (a, b) = connect(id("prod", 1, "s3cret"), id("prod", 2, "guess"));
    assert_eq!(a, Err(Refusal::BadProof));
    assert_eq!(b, Err(Refusal::BadProof));
}

#[test]
fn another_cluster_is_refused() {
    let (mut h, _) = Handshake::start(id("prod", 1, "s"), [0; 32]);
    let hello = HandshakeMsg::Hello {
        cluster: "staging".into(),
        node: 2,
        wire_version: WIRE_VERSION,
        nonce: [9; 32],
    };
    assert!(matches!(h.step(hello), Err(Refusal::WrongCluster { .. })));
    assert!(h.peer().is_none());
}

#[test]
fn another_wire_version_is_refused() {
    let (mut h, _) = Handshake::start(id("prod", 1, "s"), [0; 32]);
    let hello = HandshakeMsg::Hello {
        cluster: "prod".into(),
        node: 2,
        wire_version: WIRE_VERSION + 1,
        nonce: [9; 32],
    };
    assert_eq!(
        h.step(hello),
        Err(Refusal::Version {
            ours: WIRE_VERSION,
            theirs: WIRE_VERSION + 1
        })
    );
}

#[test]
fn proofs_cannot_be_replayed_or_reflected() {
    // A proof recorded on one connection does not open another (fresh nonces).
    let (mut a1, _) = Handshake::start(id("c", 1, "k"), [1; 32]);
    let (mut b1, hello_b1) = Handshake::start(id("c", 2, "k"), [2; 32]);
    let Outcome::Send(_) = a1.step(hello_b1).unwrap() else {
        panic!()
    };
    let (_, hello_a1) = Handshake::start(id("c", 1, "k"), [1; 32]);
    let Outcome::Send(recorded_proof_of_b) = b1.step(hello_a1).unwrap() else {
        panic!()
    };

    let (mut a2, _) = Handshake::start(id("c", 1, "k"), [3; 32]);
    let (_, hello_b2) = Handshake::start(id("c", 2, "k"), [4; 32]);
    a2.step(hello_b2).unwrap();
    assert_eq!(a2.step(recorded_proof_of_b), Err(Refusal::BadProof));

    // Reflecting a side's own proof back to it fails: proofs are bound to their direction.
    let (mut a, _) = Handshake::start(id("c", 1, "k"), [5; 32]);
    let (_, hello_b) = Handshake::start(id("c", 2, "k"), [6; 32]);
    let Outcome::Send(own_proof) = a.step(hello_b).unwrap() else {
        panic!()
    };
    assert_eq!(a.step(own_proof), Err(Refusal::BadProof));
}

#[test]
fn out_of_order_messages_and_self_connections_are_refused() {
    let (mut h, hello) = Handshake::start(id("c", 1, "k"), [0; 32]);
    assert!(matches!(
        h.step(HandshakeMsg::Proof { mac: [0; 32] }),
        Err(Refusal::Unexpected { .. })
    ));
    // Refused once, refused for good.
    let (_, other) = Handshake::start(id("c", 2, "k"), [1; 32]);
    assert!(h.step(other).is_err());

    let (mut h, _) = Handshake::start(id("c", 1, "k"), [0; 32]);
    assert_eq!(h.step(hello), Err(Refusal::SameNode(1)));
}

#[test]
fn empty_secrets_and_clusters_are_configuration_errors() {
    assert_eq!(
        Identity::new("c", 1, "").unwrap_err(),
        IdentityError::EmptySecret
    );
    assert_eq!(
        Identity::new("", 1, "k").unwrap_err(),
        IdentityError::EmptyCluster
    );
    assert!(
        !format!("{:?}", id("c", 1, "topsecret")).contains("topsecret"),
        "Debug hides the secret"
    );
}
