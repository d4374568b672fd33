//! A man in the middle on loopback, between two nodes, that tampers with the frames of one
//! direction after the handshake: it flips a bit, replays, reorders, drops or injects a frame
//! (the injected one a well-formed plaintext message). Each time the receiver closes the
//! connection and delivers nothing that was not sent, nothing twice and nothing out of order;
//! the nodes then reconnect (the man in the middle lets later connections through) and go on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atomos_net::frame::{Decoder, DEFAULT_MAX_FRAME};
use atomos_net::rpc::Envelope;
use atomos_net::tcp::LinkFrame;
use atomos_net::wire;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::*;

/// What the man in the middle does to the dialler's frames.
#[derive(Clone, Copy, Debug)]
enum Attack {
    FlipBit,
    Replay,
    Reorder,
    Drop,
    Inject,
}

/// Frames of the dialler's handshake (preamble, first message, confirmation): left alone.
const HANDSHAKE_FRAMES: usize = 3;
/// The data frame the attack starts at.
const TARGET: usize = HANDSHAKE_FRAMES + 4;
/// The note the injected frame carries: never sent by anyone.
const FORGED: u64 = 999_999;

/// Forwards `from` to `to` frame by frame, applying `attack` (if any) at frame `TARGET`.
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, attack: Option<Attack>) {
    let mut decoder = Decoder::new(DEFAULT_MAX_FRAME);
    let mut buf = vec![0u8; 64 << 10];
    let mut index = 0;
    let mut held: Option<Vec<u8>> = None;
    let mut previous: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        decoder.push(&buf[..n]);
        let mut out = Vec::new();
        while let Ok(Some(payload)) = decoder.next_frame() {
            let mut frame = Vec::new();
            atomos_net::frame::encode(payload, DEFAULT_MAX_FRAME, &mut frame).unwrap();
            match (attack, index == TARGET, index == TARGET + 1) {
                (Some(Attack::FlipBit), true, _) => {
                    let last = frame.len() - 1;
                    frame[last] ^= 0x01;
                    out.extend_from_slice(&frame);
                }
                (Some(Attack::Replay), true, _) => {
                    out.extend_from_slice(&previous);
                    out.extend_from_slice(&frame);
                }
                (Some(Attack::Reorder), true, _) => held = Some(frame.clone()),
                (Some(Attack::Reorder), _, true) => {
                    out.extend_from_slice(&frame);
                    out.extend_from_slice(&held.take().unwrap_or_default());
                }
                (Some(Attack::Drop), true, _) => {}
                (Some(Attack::Inject), true, _) => {
                    let forged = LinkFrame::App(Envelope::OneWay(Msg::Note(FORGED)));
                    wire::encode(&forged, DEFAULT_MAX_FRAME, &mut out).unwrap();
                    out.extend_from_slice(&frame);
                }
                _ => out.extend_from_slice(&frame),
            }
            previous = frame;
            index += 1;
        }
        if to.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// A proxy in front of `target`: its first connection is attacked, later ones pass.
async fn man_in_the_middle(target: SocketAddr, attack: Attack) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((dialler, _)) = listener.accept().await {
            let Ok(acceptor) = TcpStream::connect(target).await else {
                continue;
            };
            let first = connections.fetch_add(1, Ordering::SeqCst) == 0;
            let (dr, dw) = dialler.into_split();
            let (ar, aw) = acceptor.into_split();
            tokio::spawn(forward(dr, aw, first.then_some(attack)));
            tokio::spawn(forward(ar, dw, None));
        }
    });
    addr
}

async fn under_attack(attack: Attack) {
    let (mut ls, members) = {
        let mut ls = Vec::new();
        let mut members = Vec::new();
        for id in 1..=2 {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            members.push((id, l.local_addr().unwrap()));
            ls.push(l);
        }
        (ls, members)
    };
    // Node 1 dials node 2 through the man in the middle.
    let proxy = man_in_the_middle(members[1].1, attack).await;
    let seen_by_one = vec![members[0], (2, proxy)];
    let one = start(config(1, SECRET, &seen_by_one), ls.remove(0));
    let mut two = start(config(2, SECRET, &members), ls.remove(0));
    wait_link(&mut two, 1, true).await;

    // Notes one at a time, so that each travels in records of its own.
    let sent = 40u64;
    for n in 0..sent {
        let _ = one.rpc.send(2, Msg::Note(n));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_link(&mut two, 1, false).await;
    wait_link(&mut two, 1, true).await;
    one.rpc.send(2, Msg::Note(sent)).unwrap();

    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(n) = two.notes.recv().await {
            got.push(n);
            if n == sent {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{attack:?}: the link never carried notes again: {got:?}"));
    assert!(
        !got.contains(&FORGED),
        "{attack:?}: a forged message was delivered"
    );
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "{attack:?}: duplicated or reordered delivery: {got:?}"
    );
    assert!(
        got.len() < sent as usize + 1,
        "{attack:?}: the tampered connection was not closed: {got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_closes_the_connection() {
    under_attack(Attack::FlipBit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_frame_closes_the_connection() {
    under_attack(Attack::Replay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_frames_close_the_connection() {
    under_attack(Attack::Reorder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_frame_closes_the_connection() {
    under_attack(Attack::Drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_plaintext_message_closes_the_connection() {
    under_attack(Attack::Inject).await;
}
