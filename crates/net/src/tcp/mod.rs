//! The TCP transport on tokio.
//!
//! - One connection per pair of members: the member with the smaller id dials, the other
//!   accepts. A connection opens with the [`handshake`](crate::handshake) (frames of at most
//!   [`MAX_HANDSHAKE_FRAME`](crate::handshake::MAX_HANDSHAKE_FRAME) bytes, within `handshake_timeout`); from then on it carries
//!   records sealed as [`secure`](crate::secure) says, whose plaintext is a stream of frames of
//!   [`LinkFrame`]: application messages and keep-alives.
//! - At most `max_pending_handshakes` accepted connections may be handshaking at once; more
//!   are closed at once, so unauthenticated peers cost a bounded amount.
//! - Sending encodes the message straight into the peer's outbox and returns; one writer task
//!   per connection writes everything queued since its last write in one call, so a burst of
//!   small messages costs few system calls. Woken by a send, the writer first queues behind
//!   the tasks already queued on its runtime worker, so that what they send joins the same
//!   write.
//! - A lost connection is re-dialled with exponential back-off (with jitter); an idle
//!   connection carries a keep-alive, and a peer silent for `dead_after` is declared dead and
//!   its connection closed.
//! - A refused handshake, a record that does not open (tampered with, injected, replayed,
//!   reordered), a malformed, truncated or oversized frame closes the connection and is logged
//!   with the reason; nothing of a damaged record is delivered.
//! - Messages are delivered at most once: bytes queued or in flight when a connection breaks
//!   are lost, and protocols above recover.
//! - **Identities**: each side proves its own static key; the [`Roster`] shared through
//!   [`TcpConfig::roster`] says which keys are which member's and which are clients'. A
//!   connection whose key the roster stops admitting (a reload) closes.
//! - **Clients**: a member also accepts connections from clients (ids with
//!   [`CLIENT_BIT`] set, derived from their keys, which the roster lists) unless
//!   [`TcpConfig::accept_clients`] is off. A client's link lives as long as its connection:
//!   sending to a client that is not connected fails with [`SendError::UnknownPeer`]. A client
//!   runs [`TcpTransport::connect`]: it listens nowhere and dials every member.
//! - **Busy polling**: for [`TcpConfig::busy_poll`] after the transport last read or wrote, one task keeps a runtime worker awake (see `busy_poll`), so an answer is picked up
//!   without waking a sleeping thread.

mod busy_poll;
mod connection;
mod members;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::counters::{connection_event, LinkCounters};
use crate::frame::DEFAULT_MAX_FRAME;
use crate::handshake::Identity;
use crate::keys::PublicKey;
use crate::roster::Roster;
use crate::transport::{
    is_client, Deliver, FaultRules, NodeId, SendError, Transport, Verdict, CLIENT_BIT,
};
use crate::wire::{self, WireMessage};
use busy_poll::BusyPoll;
use connection::{open_connection, run_connection};

/// What travels in one frame of an established TCP connection (inside sealed records).
#[derive(Debug, Serialize, Deserialize)]
pub enum LinkFrame<M> {
    /// Sent on an idle connection so the peer knows this node is alive.
    KeepAlive,
    /// An application message.
    App(M),
}

impl<M: WireMessage> WireMessage for LinkFrame<M> {
    fn since(&self) -> u16 {
        match self {
            LinkFrame::KeepAlive => 0,
            LinkFrame::App(msg) => msg.since(),
        }
    }
}

/// Settings of a TCP transport. [`TcpConfig::new`] gives defaults suited to a LAN.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Who this node is (cluster, id, secret, key pair).
    pub identity: Identity,
    /// The other members and where they listen.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// The keys admitted: every member in `peers` must have one.
    pub roster: Arc<Roster>,
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
    /// Whether clients (ids with [`CLIENT_BIT`] set, holding a client key of the roster) may
    /// connect.
    pub accept_clients: bool,
    /// For this long after the transport last read or wrote, one task keeps a runtime
    /// worker from sleeping, so the next message is seen at once (zero: never). This trades a
    /// core's time while messages flow for the cost of waking a sleeping thread per message.
    pub busy_poll: Duration,
}

impl TcpConfig {
    /// Defaults: 16 MiB frames, keep-alive every 500 ms, dead after 3 s of silence, 3 s to
    /// handshake, re-dial after 20 ms doubling up to 1 s, 64 MiB of backlog per peer, 64
    /// connections handshaking at once, clients accepted, busy polling for
    /// [`DEFAULT_BUSY_POLL`] after activity.
    pub fn new(
        identity: Identity,
        peers: Vec<(NodeId, SocketAddr)>,
        roster: Arc<Roster>,
    ) -> TcpConfig {
        TcpConfig {
            identity,
            peers,
            roster,
            max_frame: DEFAULT_MAX_FRAME,
            keepalive: Duration::from_millis(500),
            dead_after: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(3),
            reconnect_min: Duration::from_millis(20),
            reconnect_max: Duration::from_secs(1),
            max_backlog: 64 << 20,
            max_pending_handshakes: 64,
            accept_clients: true,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }
}

/// How long a transport busy-polls after activity by default (see [`TcpConfig::busy_poll`]).
/// Measured with `atomos bench net`: 30-100 us took the round trip's median from 71-89 us to
/// 47-57 us with its p99 unchanged; 200 us and more raised the p99 to about the window.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(100);

/// The TCP transport. Dropping it (or [`Transport::shutdown`]) closes every connection.
pub struct TcpTransport<M> {
    shared: Arc<Shared<M>>,
}

struct Shared<M> {
    cfg: TcpConfig,
    local_addr: SocketAddr,
    /// The members' links; members join and leave while the transport runs.
    links: RwLock<HashMap<NodeId, Arc<Link>>>,
    /// The clients connected now, each with the link of its current connection.
    clients: Mutex<HashMap<NodeId, Arc<Link>>>,
    deliver: Arc<dyn Deliver<M>>,
    faults: FaultRules,
    stop: CancellationToken,
    busy: Arc<BusyPoll>,
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
    /// A client's link: the key its connection proved (members' links outlive connections).
    key: Option<PublicKey>,
    /// Cancelled when the member leaves: its dialling stops.
    gone: CancellationToken,
    /// The wire version of the latest connection (before the first, the oldest this build
    /// speaks, which every peer it can talk to reads): what is queued is stamped with it.
    version: AtomicU16,
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
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
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
        if is_client(me) {
            return Err(invalid(format!(
                "node id {me} has the client bit set: a member's id must be below {CLIENT_BIT}"
            )));
        }
        if let Some((peer, _)) = cfg.peers.iter().find(|(id, _)| is_client(*id)) {
            return Err(invalid(format!(
                "member id {peer} has the client bit set: a member's id must be below {CLIENT_BIT}"
            )));
        }
        check_keys(&cfg)?;
        let shared = Shared::new(cfg, listener.local_addr()?, deliver);
        tokio::spawn(shared.busy.clone().run(shared.stop.clone()));
        tokio::spawn(accept_loop(shared.clone(), listener));
        for link in shared.links.read().values() {
            if link.peer > me {
                tokio::spawn(dial_loop(shared.clone(), link.clone()));
            }
        }
        Ok(TcpTransport { shared })
    }

    /// A client's transport: it listens nowhere and dials every member of `cfg.peers`, whose
    /// messages it hands to `deliver`. The identity's id must have [`CLIENT_BIT`] set. Must be
    /// called inside a tokio runtime.
    pub fn connect(cfg: TcpConfig, deliver: Arc<dyn Deliver<M>>) -> io::Result<TcpTransport<M>> {
        let me = cfg.identity.node();
        if !is_client(me) {
            return Err(invalid(format!(
                "client id {me} lacks the client bit ({CLIENT_BIT})"
            )));
        }
        check_keys(&cfg)?;
        let nowhere = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        let shared = Shared::new(cfg, nowhere, deliver);
        tokio::spawn(shared.busy.clone().run(shared.stop.clone()));
        for link in shared.links.read().values() {
            tokio::spawn(dial_loop(shared.clone(), link.clone()));
        }
        Ok(TcpTransport { shared })
    }

    /// The address this node listens on (unspecified, port 0, for a client's transport).
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
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    fn id(&self) -> NodeId {
        self.shared.cfg.identity.node()
    }

    fn peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = self.shared.links.read().keys().copied().collect();
        peers.sort_unstable();
        peers
    }

    fn send(&self, to: NodeId, msg: M) -> Result<(), SendError> {
        let s = &self.shared;
        if s.stop.is_cancelled() {
            return Err(SendError::Closed);
        }
        let link = match s.member_link(to) {
            Some(link) => link,
            None if is_client(to) => s
                .clients
                .lock()
                .get(&to)
                .cloned()
                .ok_or(SendError::UnknownPeer(to))?,
            None => return Err(SendError::UnknownPeer(to)),
        };
        let delay = match s.faults.outgoing(to) {
            Verdict::Drop => return Ok(()),
            Verdict::Delay(d) => Some(d),
            Verdict::Pass => None,
        };
        let encode_error = |e: wire::WireError| SendError::Encode {
            peer: to,
            reason: e.to_string(),
        };
        let mut outbox = link.outbox.lock();
        // Read under the outbox's lock, which a new connection's version is set under: what is
        // queued is all of one version.
        let version = link.version();
        if msg.since() > version {
            return Err(SendError::TooNew {
                peer: to,
                since: msg.since(),
                speaks: version,
            });
        }
        let frame = LinkFrame::App(&msg);
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
            wire::encode_as(version, &frame, s.cfg.max_frame, &mut outbox.ready)
                .map_err(encode_error)?;
            was_empty
        } else {
            // Delayed frames keep their order: none is due before the one queued ahead of it.
            let mut bytes = Vec::new();
            wire::encode_as(version, &frame, s.cfg.max_frame, &mut bytes).map_err(encode_error)?;
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

/// Refuses a configuration with a member whose key the roster does not pin.
fn check_keys(cfg: &TcpConfig) -> io::Result<()> {
    let me = cfg.identity.node();
    match cfg
        .peers
        .iter()
        .find(|(id, _)| *id != me && cfg.roster.member_keys(*id).is_empty())
    {
        Some((peer, _)) => Err(invalid(format!(
            "member {peer} has no public key in the roster: its connections could not be \
             authenticated"
        ))),
        None => Ok(()),
    }
}

fn invalid(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, reason)
}

impl Link {
    fn new(
        peer: NodeId,
        addr: SocketAddr,
        counters: LinkCounters,
        gone: CancellationToken,
        version: u16,
    ) -> Link {
        Link {
            peer,
            addr,
            outbox: Mutex::new(Outbox::default()),
            wake: Notify::new(),
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            counters,
            key: None,
            gone,
            version: AtomicU16::new(version),
        }
    }

    /// The wire version what is sent to this peer now is stamped with.
    fn version(&self) -> u16 {
        self.version.load(Ordering::Acquire)
    }

    /// A connection that speaks `version` opened. Frames queued with a newer stamp are dropped
    /// (as bytes in flight are when a connection breaks): the peer does not read them. Frames
    /// with an older stamp stay: the peer reads every version up to the connection's.
    fn speak(&self, version: u16) {
        let mut outbox = self.outbox.lock();
        if self.version.swap(version, Ordering::AcqRel) > version {
            outbox.ready.clear();
            outbox.delayed.clear();
            outbox.delayed_bytes = 0;
        }
    }

    /// The member left: its dialling stops and its connection closes.
    fn leave(&self) {
        self.gone.cancel();
        if let Some((_, conn)) = self.current.lock().take() {
            conn.cancel();
        }
    }
}

impl<M> Shared<M> {
    fn new(cfg: TcpConfig, local_addr: SocketAddr, deliver: Arc<dyn Deliver<M>>) -> Arc<Self> {
        let me = cfg.identity.node();
        let cfg_busy_poll = cfg.busy_poll;
        let stop = CancellationToken::new();
        let links = cfg
            .peers
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|&(peer, addr)| {
                let counters = LinkCounters::new(me, peer);
                let link = Link::new(
                    peer,
                    addr,
                    counters,
                    stop.child_token(),
                    wire::OLDEST_WIRE_VERSION,
                );
                (peer, Arc::new(link))
            })
            .collect();
        Arc::new(Shared {
            local_addr,
            cfg,
            links: RwLock::new(links),
            clients: Mutex::new(HashMap::new()),
            deliver,
            faults: FaultRules::default(),
            stop,
            busy: BusyPoll::new(cfg_busy_poll),
        })
    }

    /// Member `peer`'s link, if it is a member now.
    fn member_link(&self, peer: NodeId) -> Option<Arc<Link>> {
        self.links.read().get(&peer).cloned()
    }

    /// Whether a connection from `peer`, authenticated by its key, may be used: a member
    /// always; a client only by a member that accepts clients, on a connection it accepted.
    fn admits(&self, peer: NodeId, accepted: bool) -> bool {
        self.links.read().contains_key(&peer)
            || (accepted
                && is_client(peer)
                && self.cfg.accept_clients
                && !is_client(self.cfg.identity.node()))
    }

    /// A fresh link for client `peer`'s new connection, proven with `key`; an older
    /// connection of the same client is closed (the client re-connected). `None` if a client
    /// with another key holds that id now (ids derive from keys: a collision, or an attempt to
    /// take another client's link).
    fn client_connected(
        &self,
        peer: NodeId,
        key: PublicKey,
        from: SocketAddr,
        version: u16,
    ) -> Option<Arc<Link>> {
        let me = self.cfg.identity.node();
        let mut link = Link::new(
            peer,
            from,
            LinkCounters::for_clients(me),
            self.stop.child_token(),
            version,
        );
        link.key = Some(key);
        let link = Arc::new(link);
        let mut clients = self.clients.lock();
        if clients.get(&peer).is_some_and(|old| old.key != Some(key)) {
            return None;
        }
        if let Some(old) = clients.insert(peer, link.clone()) {
            if let Some((_, conn)) = old.current.lock().take() {
                conn.cancel();
            }
        }
        Some(link)
    }

    /// Forgets client `link` once its connection ended (unless a newer one replaced it).
    fn client_gone(&self, link: &Arc<Link>) {
        let mut clients = self.clients.lock();
        if clients
            .get(&link.peer)
            .is_some_and(|l| Arc::ptr_eq(l, link))
        {
            clients.remove(&link.peer);
        }
    }
}

async fn accept_loop<M>(shared: Arc<Shared<M>>, listener: TcpListener)
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
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
                Ok(opened) => match shared.member_link(opened.peer) {
                    Some(link) => run_connection(&shared, &link, opened).await,
                    None => {
                        // `open_connection` admits no other peer than a member or a client.
                        match shared.client_connected(opened.peer, opened.key, from, opened.version)
                        {
                            Some(link) => {
                                run_connection(&shared, &link, opened).await;
                                shared.client_gone(&link);
                            }
                            None => {
                                warn!(node = me, client = opened.peer, %from,
                                    "refused a client whose id another client's key holds");
                                connection_event(me, Some(opened.peer), "refused");
                            }
                        }
                    }
                },
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
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
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
            _ = link.gone.cancelled() => return,
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
            _ = link.gone.cancelled() => return,
            _ = sleep(backoff.mul_f64(jitter)) => {}
        }
        backoff = (backoff * 2).min(shared.cfg.reconnect_max);
    }
}
