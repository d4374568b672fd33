//! The TCP transport on tokio.
//!
//! - One connection per pair of members: the member with the smaller id dials, the other
//!   accepts. A connection opens with the [`handshake`](crate::handshake) (frames of at most
//!   [`MAX_HANDSHAKE_FRAME`] bytes, within `handshake_timeout`); from then on it carries
//!   records sealed as [`secure`](crate::secure) says, whose plaintext is a stream of frames of
//!   [`LinkFrame`]: application messages and keep-alives.
//! - At most `max_pending_handshakes` accepted connections may be handshaking at once; more
//!   are closed at once, so unauthenticated peers cost a bounded amount.
//! - Sending encodes the message straight into the peer's outbox and returns; one writer task
//!   per connection writes everything queued since its last write in one call, so a burst of
//!   small messages costs few system calls.
//! - A lost connection is re-dialled with exponential back-off (with jitter); an idle
//!   connection carries a keep-alive, and a peer silent for `dead_after` is declared dead and
//!   its connection closed.
//! - A refused handshake, a record that does not open (tampered with, injected, replayed,
//!   reordered), a malformed, truncated or oversized frame closes the connection and is logged
//!   with the reason; nothing of a damaged record is delivered.
//! - Messages are delivered at most once: bytes queued or in flight when a connection breaks
//!   are lost, and protocols above recover.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::counters::{connection_event, LinkCounters};
use crate::frame::{Decoder, DEFAULT_MAX_FRAME};
use crate::handshake::{Handshake, Identity, Progress, Role, MAX_HANDSHAKE_FRAME};
use crate::secure::{Opener, Sealer, MAX_RECORD};
use crate::transport::{Deliver, FaultRules, NodeId, SendError, Transport, Verdict};
use crate::wire;

/// What travels in one frame of an established TCP connection (inside sealed records).
#[derive(Debug, Serialize, Deserialize)]
pub enum LinkFrame<M> {
    /// Sent on an idle connection so the peer knows this node is alive.
    KeepAlive,
    /// An application message.
    App(M),
}

/// Settings of a TCP transport. [`TcpConfig::new`] gives defaults suited to a LAN.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Who this node is (cluster, id, secret).
    pub identity: Identity,
    /// The other members and where they listen.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// An idle connection carries a keep-alive this often.
    pub keepalive: Duration,
    /// A peer that sends nothing (not even a keep-alive) for this long is declared dead.
    pub dead_after: Duration,
    /// Limit on connecting plus handshaking.
    pub handshake_timeout: Duration,
    /// First delay before re-dialling a lost peer; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest delay between dial attempts.
    pub reconnect_max: Duration,
    /// Bytes that may wait for one peer before sends to it fail with [`SendError::Backlog`].
    pub max_backlog: usize,
    /// Accepted connections that may be handshaking at once; more are closed unanswered.
    pub max_pending_handshakes: usize,
}

impl TcpConfig {
    /// Defaults: 16 MiB frames, keep-alive every 500 ms, dead after 3 s of silence, 3 s to
    /// handshake, re-dial after 20 ms doubling up to 1 s, 64 MiB of backlog per peer, 64
    /// connections handshaking at once.
    pub fn new(identity: Identity, peers: Vec<(NodeId, SocketAddr)>) -> TcpConfig {
        TcpConfig {
            identity,
            peers,
            max_frame: DEFAULT_MAX_FRAME,
            keepalive: Duration::from_millis(500),
            dead_after: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(3),
            reconnect_min: Duration::from_millis(20),
            reconnect_max: Duration::from_secs(1),
            max_backlog: 64 << 20,
            max_pending_handshakes: 64,
        }
    }
}

/// The TCP transport. Dropping it (or [`Transport::shutdown`]) closes every connection.
pub struct TcpTransport<M> {
    shared: Arc<Shared<M>>,
}

struct Shared<M> {
    cfg: TcpConfig,
    local_addr: SocketAddr,
    links: HashMap<NodeId, Arc<Link>>,
    deliver: Arc<dyn Deliver<M>>,
    faults: FaultRules,
    stop: CancellationToken,
}

/// Everything about one peer that outlives its connections.
struct Link {
    peer: NodeId,
    addr: SocketAddr,
    outbox: Mutex<Outbox>,
    /// Wakes the writer when the outbox goes from empty to non-empty.
    wake: Notify,
    /// The current connection, cancelled when a newer one replaces it.
    current: Mutex<Option<(u64, CancellationToken)>>,
    generation: AtomicU64,
    counters: LinkCounters,
}

#[derive(Default)]
struct Outbox {
    /// Encoded frames ready to be written.
    ready: Vec<u8>,
    /// Frames held back by a delay rule, in due order.
    delayed: VecDeque<(Instant, Vec<u8>)>,
    delayed_bytes: usize,
}

impl Outbox {
    fn queued(&self) -> usize {
        self.ready.len() + self.delayed_bytes
    }

    /// Moves frames whose delay is over to `ready`; returns when the next one is due.
    fn release_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some((due, _)) = self.delayed.front() {
            if *due > now {
                return Some(*due);
            }
            if let Some((_, bytes)) = self.delayed.pop_front() {
                self.delayed_bytes -= bytes.len();
                self.ready.extend_from_slice(&bytes);
            }
        }
        None
    }
}

impl<M> TcpTransport<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Listens on `listen` and starts connecting to the members. Must be called inside a tokio
    /// runtime. What arrives is handed to `deliver`.
    pub async fn bind(
        cfg: TcpConfig,
        listen: SocketAddr,
        deliver: Arc<dyn Deliver<M>>,
    ) -> io::Result<TcpTransport<M>> {
        let listener = TcpListener::bind(listen).await?;
        Self::start(cfg, listener, deliver)
    }

    /// Like [`TcpTransport::bind`], on a listener the caller already bound.
    pub fn start(
        cfg: TcpConfig,
        listener: TcpListener,
        deliver: Arc<dyn Deliver<M>>,
    ) -> io::Result<TcpTransport<M>> {
        let me = cfg.identity.node();
        let links = cfg
            .peers
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|&(peer, addr)| {
                let link = Link {
                    peer,
                    addr,
                    outbox: Mutex::new(Outbox::default()),
                    wake: Notify::new(),
                    current: Mutex::new(None),
                    generation: AtomicU64::new(0),
                    counters: LinkCounters::new(me, peer),
                };
                (peer, Arc::new(link))
            })
            .collect();
        let shared = Arc::new(Shared {
            local_addr: listener.local_addr()?,
            cfg,
            links,
            deliver,
            faults: FaultRules::default(),
            stop: CancellationToken::new(),
        });
        tokio::spawn(accept_loop(shared.clone(), listener));
        for link in shared.links.values() {
            if link.peer > me {
                tokio::spawn(dial_loop(shared.clone(), link.clone()));
            }
        }
        Ok(TcpTransport { shared })
    }

    /// The address this node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }
}

impl<M> Drop for TcpTransport<M> {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl<M> Transport<M> for TcpTransport<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    fn id(&self) -> NodeId {
        self.shared.cfg.identity.node()
    }

    fn peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = self.shared.links.keys().copied().collect();
        peers.sort_unstable();
        peers
    }

    fn send(&self, to: NodeId, msg: M) -> Result<(), SendError> {
        let s = &self.shared;
        if s.stop.is_cancelled() {
            return Err(SendError::Closed);
        }
        let link = s.links.get(&to).ok_or(SendError::UnknownPeer(to))?;
        let delay = match s.faults.outgoing(to) {
            Verdict::Drop => return Ok(()),
            Verdict::Delay(d) => Some(d),
            Verdict::Pass => None,
        };
        let encode_error = |e: wire::WireError| SendError::Encode {
            peer: to,
            reason: e.to_string(),
        };
        let frame = LinkFrame::App(&msg);
        let mut outbox = link.outbox.lock();
        let queued = outbox.queued();
        if queued > s.cfg.max_backlog {
            return Err(SendError::Backlog {
                peer: to,
                queued,
                limit: s.cfg.max_backlog,
            });
        }
        let wake = if delay.is_none() && outbox.delayed.is_empty() {
            let was_empty = outbox.ready.is_empty();
            wire::encode(&frame, s.cfg.max_frame, &mut outbox.ready).map_err(encode_error)?;
            was_empty
        } else {
            // Delayed frames keep their order: none is due before the one queued ahead of it.
            let mut bytes = Vec::new();
            wire::encode(&frame, s.cfg.max_frame, &mut bytes).map_err(encode_error)?;
            let mut due = Instant::now() + delay.unwrap_or_default();
            if let Some((last, _)) = outbox.delayed.back() {
                due = due.max(*last);
            }
            outbox.delayed_bytes += bytes.len();
            outbox.delayed.push_back((due, bytes));
            true
        };
        drop(outbox);
        link.counters.sent_messages.increment(1);
        if wake {
            link.wake.notify_one();
        }
        Ok(())
    }

    fn faults(&self) -> &FaultRules {
        &self.shared.faults
    }

    fn shutdown(&self) {
        self.shared.stop.cancel();
    }
}

/// Why a connection could not be opened or was closed.
type Reason = String;

async fn accept_loop<M>(shared: Arc<Shared<M>>, listener: TcpListener)
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    let me = shared.cfg.identity.node();
    let pending = Arc::new(Semaphore::new(shared.cfg.max_pending_handshakes));
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, from) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                warn!(node = me, error = %e, "cannot accept a connection");
                sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = pending.clone().try_acquire_owned() else {
            debug!(node = me, %from, "too many connections handshaking: one closed unanswered");
            connection_event(me, None, "shed");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let opened = timeout(
                shared.cfg.handshake_timeout,
                open_connection(&shared, stream, None),
            )
            .await
            .unwrap_or_else(|_| Err(("handshake timed out".to_string(), None)));
            drop(permit);
            match opened {
                Ok(opened) => {
                    let link = shared.links[&opened.peer].clone();
                    run_connection(&shared, &link, opened).await;
                }
                Err((reason, peer)) => {
                    warn!(node = me, peer = ?peer, %from, %reason, "refused an incoming connection");
                    connection_event(me, peer, "refused");
                }
            }
        });
    }
}

async fn dial_loop<M>(shared: Arc<Shared<M>>, link: Arc<Link>)
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    let me = shared.cfg.identity.node();
    let mut backoff = shared.cfg.reconnect_min;
    let mut failures = 0u64;
    loop {
        let attempt = async {
            let stream = TcpStream::connect(link.addr)
                .await
                .map_err(|e| (format!("cannot connect to {}: {e}", link.addr), None))?;
            open_connection(&shared, stream, Some(link.peer)).await
        };
        let opened = tokio::select! {
            _ = shared.stop.cancelled() => return,
            opened = timeout(shared.cfg.handshake_timeout, attempt) => opened
                .unwrap_or_else(|_| Err(("handshake timed out".to_string(), None))),
        };
        match opened {
            Ok(opened) => {
                failures = 0;
                backoff = shared.cfg.reconnect_min;
                run_connection(&shared, &link, opened).await;
            }
            Err((reason, refused_by)) => {
                failures += 1;
                if refused_by.is_some() {
                    warn!(node = me, peer = link.peer, %reason, "connection refused");
                    connection_event(me, Some(link.peer), "refused");
                } else if failures == 1 || failures.is_multiple_of(30) {
                    debug!(node = me, peer = link.peer, %reason, failures, "peer unreachable");
                }
            }
        }
        // Jitter in [backoff/2, backoff], so restarted clusters do not dial in lock-step.
        let jitter = rand::random::<f64>() * 0.5 + 0.5;
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = sleep(backoff.mul_f64(jitter)) => {}
        }
        backoff = (backoff * 2).min(shared.cfg.reconnect_max);
    }
}

/// A connection whose peer is authenticated.
struct Opened {
    stream: TcpStream,
    peer: NodeId,
    sealer: Sealer,
    opener: Opener,
    /// Holds the sealed records that arrived with the end of the handshake.
    records: Decoder,
}

/// Handshakes on a fresh stream. `expect` is the peer a dialler meant to reach. On refusal,
/// returns the reason and, when the handshake itself refused, the peer it refused (or the
/// expected one).
async fn open_connection<M>(
    shared: &Shared<M>,
    mut stream: TcpStream,
    expect: Option<NodeId>,
) -> Result<Opened, (Reason, Option<NodeId>)>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    let io_err = |e: io::Error| (format!("connection failed during the handshake: {e}"), None);
    stream.set_nodelay(true).map_err(io_err)?;
    let role = match expect {
        Some(_) => Role::Initiator,
        None => Role::Responder,
    };
    let mut out = Vec::new();
    let mut handshake = Handshake::start(shared.cfg.identity.clone(), role, &mut out);
    if let Some(peer) = expect {
        handshake.expect_peer(peer);
    }
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
                sealer,
                opener,
            } = progress
            {
                if !shared.links.contains_key(&peer) {
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
async fn run_connection<M>(shared: &Shared<M>, link: &Arc<Link>, opened: Opened)
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    let me = shared.cfg.identity.node();
    let conn = shared.stop.child_token();
    let generation = link.generation.fetch_add(1, Ordering::AcqRel) + 1;
    if let Some((_, old)) = link.current.lock().replace((generation, conn.clone())) {
        old.cancel();
    }
    info!(node = me, peer = link.peer, "link up");
    connection_event(me, Some(link.peer), "up");
    shared.deliver.link(link.peer, true);

    let (rd, wr) = opened.stream.into_split();
    let writer = tokio::spawn(write_loop(
        link.clone(),
        wr,
        opened.sealer,
        conn.clone(),
        shared.cfg.keepalive,
        shared.cfg.max_frame,
    ));
    let reason = read_loop(shared, link, rd, opened.opener, opened.records, &conn).await;
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
        } else {
            warn!(node = me, peer = link.peer, %reason, "link down");
            connection_event(me, Some(link.peer), "down");
        }
        shared.deliver.link(link.peer, false);
    }
}

async fn write_loop(
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
            _ = conn.cancelled() => return Ok(()),
            _ = link.wake.notified() => {}
            _ = sleep_until(wake_at) => {
                if Instant::now() >= idle_until {
                    let mut outbox = link.outbox.lock();
                    // A keep-alive cannot fail to encode: it is a unit variant.
                    let _ = wire::encode(&LinkFrame::<()>::KeepAlive, max_frame, &mut outbox.ready);
                }
            }
        }
    }
}

/// Reads and delivers until the connection ends; returns why it ended.
async fn read_loop<M>(
    shared: &Shared<M>,
    link: &Link,
    mut rd: OwnedReadHalf,
    mut opener: Opener,
    mut records: Decoder,
    conn: &CancellationToken,
) -> Reason
where
    M: Serialize + DeserializeOwned + Send + 'static,
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
            if let Err(reason) = deliver_frames(shared, link, &mut frames) {
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
                link.counters.received_bytes.increment(n as u64);
                records.push(&buf[..n]);
            }
        }
    }
}

/// Delivers the whole frames of opened plaintext; an error is why the connection must close.
fn deliver_frames<M>(shared: &Shared<M>, link: &Link, frames: &mut Decoder) -> Result<(), Reason>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    while let Some(payload) = frames.next_frame().map_err(|e| format!("bad frame: {e}"))? {
        match wire::decode::<LinkFrame<M>>(payload) {
            Ok(LinkFrame::App(msg)) => {
                link.counters.received_messages.increment(1);
                if !shared.faults.refuse_incoming(link.peer) {
                    shared.deliver.message(link.peer, msg);
                }
            }
            Ok(LinkFrame::KeepAlive) => {}
            Err(e) => return Err(format!("bad message: {e}")),
        }
    }
    Ok(())
}
