//! One established connection: the handshake that opens it, then a reader and a writer
//! until it fails, is replaced, or the transport stops.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::busy_poll::BusyPoll;
use super::{Link, LinkFrame, Reason, Shared};
use crate::counters::connection_event;
use crate::frame::Decoder;
use crate::handshake::{Handshake, Progress, Role, MAX_HANDSHAKE_FRAME};
use crate::keys::PublicKey;
use crate::secure::{Opener, Sealer, MAX_RECORD};
use crate::transport::NodeId;
use crate::wire::{self, WireMessage};

/// A connection whose peer is authenticated.
pub(super) struct Opened {
    stream: TcpStream,
    pub(super) peer: NodeId,
    /// The wire version the connection speaks.
    pub(super) version: u16,
    /// The static key the peer proved.
    pub(super) key: PublicKey,
    sealer: Sealer,
    opener: Opener,
    /// Holds the sealed records that arrived with the end of the handshake.
    records: Decoder,
}

/// Handshakes on a fresh stream. `expect` is the peer a dialler meant to reach. On refusal,
/// returns the reason and, when the handshake itself refused, the peer it refused (or the
/// expected one).
pub(super) async fn open_connection<M>(
    shared: &Shared<M>,
    mut stream: TcpStream,
    expect: Option<NodeId>,
) -> Result<Opened, (Reason, Option<NodeId>)>
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    let io_err = |e: io::Error| (format!("connection failed during the handshake: {e}"), None);
    stream.set_nodelay(true).map_err(io_err)?;
    let role = match expect {
        Some(_) => Role::Initiator,
        None => Role::Responder,
    };
    let mut out = Vec::new();
    let (me, roster) = (shared.cfg.identity.clone(), shared.cfg.roster.clone());
    let mut handshake = match expect {
        Some(peer) => Handshake::dial(me, roster, peer, &mut out),
        None => Handshake::accept(me, roster, &mut out),
    };
    stream.write_all(&out).await.map_err(io_err)?;
    let mut records = Decoder::new(MAX_HANDSHAKE_FRAME);
    let mut buf = [0u8; 1024];
    let refused = |reason: String, peer: Option<NodeId>| (reason, peer.or(expect));
    loop {
        while let Some(payload) = records
            .next_frame()
            .map_err(|e| refused(format!("bad frame during the handshake: {e}"), None))?
        {
            out.clear();
            let progress = handshake
                .step(payload, &mut out)
                .map_err(|refusal| refused(refusal.to_string(), None))?;
            if !out.is_empty() {
                stream.write_all(&out).await.map_err(io_err)?;
            }
            if let Progress::Established {
                peer,
                version,
                key,
                sealer,
                opener,
            } = progress
            {
                if !shared.admits(peer, role == Role::Responder) {
                    return Err(refused(
                        format!("node {peer} is not a member of this cluster"),
                        Some(peer),
                    ));
                }
                if expect.is_some_and(|e| e != peer) {
                    return Err(refused(
                        format!("expected node {expect:?} at this address, found {peer}"),
                        Some(peer),
                    ));
                }
                records.set_max_frame(MAX_RECORD);
                return Ok(Opened {
                    stream,
                    peer,
                    version,
                    key,
                    sealer,
                    opener,
                    records,
                });
            }
        }
        let n = stream.read(&mut buf).await.map_err(io_err)?;
        if n == 0 {
            let reason = match role {
                Role::Initiator => {
                    "the peer closed the connection during the handshake (a peer that does \
                     not share this node's cluster secret closes it so)"
                }
                Role::Responder => "the peer closed the connection during the handshake",
            };
            return Err(refused(reason.into(), None));
        }
        records.push(&buf[..n]);
    }
}

/// Runs an established connection until it fails, is replaced, or the transport stops.
pub(super) async fn run_connection<M>(shared: &Shared<M>, link: &Arc<Link>, opened: Opened)
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    let me = shared.cfg.identity.node();
    // Watched from before the check, so a reload racing with this connection's start is
    // either seen by the check or wakes the watcher.
    let changes = shared.cfg.roster.subscribe();
    if !shared.cfg.roster.still_admits(link.peer, &opened.key) {
        warn!(
            node = me,
            peer = link.peer,
            "the peer's key was revoked as it connected"
        );
        connection_event(me, Some(link.peer), "refused");
        return;
    }
    let conn = shared.stop.child_token();
    let generation = link.generation.fetch_add(1, Ordering::AcqRel) + 1;
    {
        // The version is set with the connection, under its lock: a connection replaced as this
        // one starts leaves the link at the version of the one that won.
        let mut current = link.current.lock();
        if let Some((_, old)) = current.replace((generation, conn.clone())) {
            old.cancel();
        }
        link.speak(opened.version);
    }
    // The member left, or its link was replaced (another address), while this connection
    // opened: it carries nothing.
    if link.gone.is_cancelled() {
        conn.cancel();
        return;
    }
    // A client comes and goes as it pleases: its links are logged at debug level.
    let client = crate::transport::is_client(link.peer);
    if client {
        debug!(
            node = me,
            client = link.peer,
            wire_version = opened.version,
            "client connected"
        );
    } else {
        info!(
            node = me,
            peer = link.peer,
            wire_version = opened.version,
            "link up"
        );
    }
    connection_event(me, Some(link.peer), "up");
    shared.deliver.link(link.peer, true);
    tokio::spawn(close_when_revoked(
        shared.cfg.roster.clone(),
        changes,
        link.peer,
        opened.key,
        conn.clone(),
    ));

    let (rd, wr) = opened.stream.into_split();
    let writer = tokio::spawn(write_loop(
        shared.busy.clone(),
        link.clone(),
        wr,
        opened.sealer,
        conn.clone(),
        shared.cfg.keepalive,
        shared.cfg.max_frame,
    ));
    let reason = read_loop(
        shared,
        link,
        rd,
        (opened.opener, opened.version),
        opened.records,
        &conn,
    )
    .await;
    conn.cancel();
    let reason = match writer.await {
        Ok(Err(e)) => format!("write failed: {e}"),
        _ => reason,
    };
    let mut current = link.current.lock();
    if current.as_ref().is_some_and(|(g, _)| *g == generation) {
        *current = None;
        drop(current);
        if shared.stop.is_cancelled() {
            debug!(node = me, peer = link.peer, "link closed at shutdown");
        } else if client {
            debug!(node = me, client = link.peer, %reason, "client disconnected");
        } else {
            warn!(node = me, peer = link.peer, %reason, "link down");
            connection_event(me, Some(link.peer), "down");
        }
        shared.deliver.link(link.peer, false);
    }
}

/// Closes the connection of `peer`, proven with `key`, once the roster no longer admits that
/// key (a client revoked, a member's old key retired); ends with the connection.
async fn close_when_revoked(
    roster: Arc<crate::roster::Roster>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    peer: NodeId,
    key: PublicKey,
    conn: CancellationToken,
) {
    loop {
        if !roster.still_admits(peer, &key) {
            warn!(
                peer,
                key = %key.fingerprint(),
                "the peer's key is no longer admitted: its connection closes"
            );
            conn.cancel();
            return;
        }
        tokio::select! {
            _ = conn.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

async fn write_loop(
    busy: Arc<BusyPoll>,
    link: Arc<Link>,
    mut wr: OwnedWriteHalf,
    mut sealer: Sealer,
    conn: CancellationToken,
    keepalive: Duration,
    max_frame: usize,
) -> io::Result<()> {
    let mut batch: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut sealed: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut last_write = Instant::now();
    loop {
        let next_due = {
            let mut outbox = link.outbox.lock();
            // A newer connection replaced this one: what is queued is for it.
            if conn.is_cancelled() {
                return Ok(());
            }
            let next_due = outbox.release_due(Instant::now());
            std::mem::swap(&mut outbox.ready, &mut batch);
            next_due
        };
        if !batch.is_empty() {
            sealed.clear();
            sealer
                .seal(&batch, &mut sealed)
                .map_err(|e| io::Error::other(e.to_string()))?;
            tokio::select! {
                _ = conn.cancelled() => return Ok(()),
                written = wr.write_all(&sealed) => written?,
            }
            link.counters.sent_bytes.increment(sealed.len() as u64);
            busy.touch();
            batch.clear();
            if batch.capacity() > 4 << 20 {
                batch = Vec::with_capacity(64 << 10);
                sealed = Vec::with_capacity(64 << 10);
            }
            last_write = Instant::now();
            continue;
        }
        let idle_until = last_write + keepalive;
        let wake_at = next_due.map_or(idle_until, |d| d.min(idle_until));
        tokio::select! {
            biased;
            _ = conn.cancelled() => return Ok(()),
            _ = link.wake.notified() => {
                // Let the tasks queued on this worker run first: what they send joins this
                // write (under load, one system call for many frames).
                queue_behind().await;
            }
            _ = sleep_until(wake_at) => {
                if Instant::now() >= idle_until {
                    let mut outbox = link.outbox.lock();
                    // A keep-alive cannot fail to encode: it is a unit variant.
                    let _ = wire::encode_as(
                        link.version(),
                        &LinkFrame::<()>::KeepAlive,
                        max_frame,
                        &mut outbox.ready,
                    );
                }
            }
        }
    }
}

/// Yields once: the task is woken at once, so Tokio queues it behind the tasks already queued
/// on its worker (another worker may take it meanwhile). Unlike `tokio::task::yield_now`,
/// whose task waits until its worker has nothing else to run, so that a worker kept busy
/// holds it back.
async fn queue_behind() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// Reads and delivers until the connection ends; returns why it ended. `opener` opens what the
/// peer seals; no message may be stamped with a version above `version`, the connection's.
async fn read_loop<M>(
    shared: &Shared<M>,
    link: &Link,
    mut rd: OwnedReadHalf,
    (mut opener, version): (Opener, u16),
    mut records: Decoder,
    conn: &CancellationToken,
) -> Reason
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    let mut buf = vec![0u8; 64 << 10];
    let mut frames = Decoder::new(shared.cfg.max_frame);
    let mut plain = Vec::with_capacity(MAX_RECORD);
    loop {
        loop {
            let record = match records.next_frame() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return format!("bad record: {e}"),
            };
            plain.clear();
            if let Err(e) = opener.open(record, &mut plain) {
                return e.to_string();
            }
            frames.push(&plain);
            if let Err(reason) = deliver_frames(shared, link, version, &mut frames) {
                return reason;
            }
        }
        let read = tokio::select! {
            _ = conn.cancelled() => return "closed".into(),
            read = timeout(shared.cfg.dead_after, rd.read(&mut buf)) => read,
        };
        match read {
            Err(_) => {
                return format!(
                    "peer silent for {} ms, declared dead",
                    shared.cfg.dead_after.as_millis()
                )
            }
            Ok(Err(e)) => return format!("read failed: {e}"),
            Ok(Ok(0)) => {
                let ended = records.finish().map_err(|e| format!("in a record: {e}"));
                let ended = ended.and_then(|()| frames.finish().map_err(|e| e.to_string()));
                return match ended {
                    Ok(()) => "the peer closed the connection".into(),
                    Err(e) => format!("the peer closed the connection: {e}"),
                };
            }
            Ok(Ok(n)) => {
                shared.busy.touch();
                link.counters.received_bytes.increment(n as u64);
                records.push(&buf[..n]);
            }
        }
    }
}

/// Delivers the whole frames of opened plaintext, each a message stamped with at most the
/// connection's wire `version` (frames queued before the connection opened carry an older
/// stamp); an error is why the connection must close.
fn deliver_frames<M>(
    shared: &Shared<M>,
    link: &Link,
    version: u16,
    frames: &mut Decoder,
) -> Result<(), Reason>
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    while let Some(payload) = frames.next_frame().map_err(|e| format!("bad frame: {e}"))? {
        match wire::decode_stamped::<LinkFrame<M>>(payload) {
            Ok((stamped, _)) if stamped > version => {
                return Err(format!(
                    "a message of wire version {stamped} on a connection that speaks {version}"
                ))
            }
            Ok((_, LinkFrame::App(msg))) => {
                link.counters.received_messages.increment(1);
                if !shared.faults.refuse_incoming(link.peer) {
                    shared.deliver.message(link.peer, msg);
                }
            }
            Ok((_, LinkFrame::KeepAlive)) => {}
            Err(e) => return Err(format!("bad message: {e}")),
        }
    }
    Ok(())
}
