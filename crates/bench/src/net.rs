//! `atomos bench net`: the cost of the network layer between two nodes on loopback.
//!
//! Four phases, each a quarter of the duration, in one process:
//! 1. a blocking TCP ping-pong of `message_bytes` (`std::net`, `TCP_NODELAY`, one thread each
//!    side, no runtime): the baseline (on a machine where waking a sleeping thread is costly,
//!    a transport that busy-polls goes below it);
//! 2. the same ping-pong on plain tokio sockets (no framing, no handshake);
//! 3. request/response round trips through the TCP transport and the request layer, one
//!    request outstanding;
//! 4. one-way messages of `message_bytes` payload, sent as fast as the sender can, counted as
//!    they reach the receiver's inbox.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::net::rpc::{Envelope, Inbound, Rpc};
use atomos::net::tcp::{TcpConfig, TcpTransport};
use atomos::net::transport::{LinkRule, SendError, Transport};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Settings of a network benchmark.
#[derive(Clone, Debug)]
pub struct NetBenchConfig {
    /// Total time; each of the four phases gets a quarter.
    pub duration: Duration,
    /// Payload bytes per message.
    pub message_bytes: usize,
    /// Delay applied to every link of the two nodes (not to the plain ping-pongs).
    pub link_delay: Duration,
}

/// What `atomos bench net` reports (microseconds for latencies).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetReport {
    /// Always "net".
    pub workload: String,
    /// Seconds of the whole run.
    pub duration_s: f64,
    /// Payload bytes per message.
    pub message_bytes: usize,
    /// Delay set on every link of the two nodes.
    pub link_delay_ms: f64,
    /// Request/response round trip through the transport, median.
    pub rtt_p50_us: f64,
    /// Request/response round trip, 99th percentile.
    pub rtt_p99_us: f64,
    /// Round trips measured.
    pub rtt_samples: u64,
    /// Blocking-socket TCP ping-pong round trip (one thread each side, no runtime), median.
    pub blocking_tcp_rtt_p50_us: f64,
    /// Blocking-socket TCP ping-pong round trip, 99th percentile.
    pub blocking_tcp_rtt_p99_us: f64,
    /// Request/response median over the blocking ping-pong's median.
    pub rtt_over_blocking: f64,
    /// Plain tokio TCP ping-pong round trip, median.
    pub raw_tcp_rtt_p50_us: f64,
    /// Plain tokio TCP ping-pong round trip, 99th percentile.
    pub raw_tcp_rtt_p99_us: f64,
    /// One-way messages received per second.
    pub oneway_msgs_per_s: f64,
    /// Times the sender found the peer's queue full and waited.
    pub oneway_backlog_waits: u64,
}

impl NetReport {
    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "net: request/response p50 {:.1} us, p99 {:.1} us ({} round trips), {:.1}x the blocking-socket p50 of {:.1} us (p99 {:.1} us); tokio TCP p50 {:.1} us, p99 {:.1} us; one-way {:.0} msgs/s of {} bytes",
            self.rtt_p50_us,
            self.rtt_p99_us,
            self.rtt_samples,
            self.rtt_over_blocking,
            self.blocking_tcp_rtt_p50_us,
            self.blocking_tcp_rtt_p99_us,
            self.raw_tcp_rtt_p50_us,
            self.raw_tcp_rtt_p99_us,
            self.oneway_msgs_per_s,
            self.message_bytes
        )
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum NetMsg {
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Data(Vec<u8>),
}

impl atomos::net::wire::WireMessage for NetMsg {}

type Node = (Rpc<NetMsg>, Arc<TcpTransport<Envelope<NetMsg>>>);

/// The shortest run: each phase needs time for some round trips.
const MIN_DURATION: Duration = Duration::from_millis(40);

/// The largest message the benchmark sends: well inside the transport's default frame limit.
const MAX_MESSAGE_BYTES: usize = 8 << 20;

/// Runs the four phases.
pub fn run(cfg: &NetBenchConfig) -> Result<NetReport, String> {
    if cfg.duration < MIN_DURATION {
        return Err(format!(
            "--duration must be at least {} ms",
            MIN_DURATION.as_millis()
        ));
    }
    if !(1..=MAX_MESSAGE_BYTES).contains(&cfg.message_bytes) {
        return Err(format!(
            "--message-bytes must be from 1 to {MAX_MESSAGE_BYTES}, not {}",
            cfg.message_bytes
        ));
    }
    let phase = cfg.duration / 4;
    let blocking = blocking_tcp_ping_pong(phase, cfg.message_bytes)
        .map_err(|e| format!("blocking TCP phase: {e}"))?;
    crate::network_runtime(crate::DEFAULT_RUNTIME_THREADS)?
        .block_on(run_phases(cfg, phase, blocking))
}

async fn run_phases(
    cfg: &NetBenchConfig,
    phase: Duration,
    blocking: Histogram<u64>,
) -> Result<NetReport, String> {
    let raw = raw_tcp_ping_pong(phase, cfg.message_bytes)
        .await
        .map_err(|e| format!("raw TCP phase: {e}"))?;

    let (received, nodes) = two_nodes().await?;
    for (_, t) in &nodes {
        t.faults().set_all(LinkRule {
            delay: cfg.link_delay,
            ..LinkRule::default()
        });
    }
    let rtt = rpc_round_trips(&nodes[0].0, phase, cfg.message_bytes).await?;
    let (oneway, waits) = one_way(&nodes[0].0, &received, phase, cfg.message_bytes).await?;
    for (_, t) in &nodes {
        t.shutdown();
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(NetReport {
        workload: "net".into(),
        duration_s: cfg.duration.as_secs_f64(),
        message_bytes: cfg.message_bytes,
        link_delay_ms: cfg.link_delay.as_secs_f64() * 1000.0,
        rtt_p50_us: us(&rtt, 0.5),
        rtt_p99_us: us(&rtt, 0.99),
        rtt_samples: rtt.len(),
        blocking_tcp_rtt_p50_us: us(&blocking, 0.5),
        blocking_tcp_rtt_p99_us: us(&blocking, 0.99),
        rtt_over_blocking: us(&rtt, 0.5) / us(&blocking, 0.5).max(0.001),
        raw_tcp_rtt_p50_us: us(&raw, 0.5),
        raw_tcp_rtt_p99_us: us(&raw, 0.99),
        oneway_msgs_per_s: oneway,
        oneway_backlog_waits: waits,
    })
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, up to 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Ping-pong on blocking sockets: the echo side on a thread of its own, the timing side on the
/// calling thread. Each side sleeps in the kernel until its data arrives, so this is the round
/// trip of the loopback stack and two thread wake-ups, with no runtime in between.
fn blocking_tcp_ping_pong(phase: Duration, size: usize) -> std::io::Result<Histogram<u64>> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut s = std::net::TcpStream::connect(listener.local_addr()?)?;
    // Accepted here, so that no thread is left waiting when connecting fails.
    let (mut echoing, _) = listener.accept()?;
    echoing.set_nodelay(true)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let s = &mut echoing;
        let mut buf = vec![0u8; size];
        while s.read_exact(&mut buf).is_ok() {
            s.write_all(&buf)?;
        }
        Ok(())
    });
    s.set_nodelay(true)?;
    let mut buf = vec![7u8; size];
    let mut h = histogram();
    let end = Instant::now() + phase;
    while Instant::now() < end {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    drop(s);
    if h.is_empty() {
        return Err(std::io::Error::other("no round trip within the phase"));
    }
    echo.join()
        .map_err(|_| std::io::Error::other("the echo thread panicked"))??;
    Ok(h)
}

async fn raw_tcp_ping_pong(phase: Duration, size: usize) -> std::io::Result<Histogram<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        while s.read_exact(&mut buf).await.is_ok() {
            s.write_all(&buf).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut buf = vec![7u8; size];
    let mut h = histogram();
    let end = Instant::now() + phase;
    while Instant::now() < end {
        let t = Instant::now();
        s.write_all(&buf).await?;
        s.read_exact(&mut buf).await?;
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    drop(s);
    let _ = echo.await;
    Ok(h)
}

/// Two nodes on loopback: node 1 asks, node 2 answers pings and counts data messages.
async fn two_nodes() -> Result<(Arc<AtomicU64>, Vec<Node>), String> {
    let mut listeners = Vec::new();
    let mut members: Vec<(u64, SocketAddr)> = Vec::new();
    for id in 1..=2u64 {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen on loopback: {e}"))?;
        members.push((id, l.local_addr().map_err(|e| e.to_string())?));
        listeners.push(l);
    }
    let received = Arc::new(AtomicU64::new(0));
    let mut nodes = Vec::new();
    let mut up = Vec::new();
    for (id, listener) in (1..=2u64).zip(listeners) {
        let identity = crate::keys::member_identity("bench", id)?;
        let (rpc, mut inbox) = Rpc::<NetMsg>::new();
        let transport = TcpTransport::start(
            TcpConfig::new(identity, members.clone(), crate::keys::roster([1, 2])),
            listener,
            rpc.deliverer(),
        )
        .map_err(|e| format!("cannot start node {id}: {e}"))?;
        let transport = Arc::new(transport);
        rpc.attach(transport.clone());
        let count = received.clone();
        let (up_tx, up_rx) = tokio::sync::oneshot::channel();
        let mut up_tx = Some(up_tx);
        tokio::spawn(async move {
            while let Some(inbound) = inbox.recv().await {
                match inbound {
                    Inbound::Request {
                        msg: NetMsg::Ping(b),
                        reply,
                        ..
                    } => {
                        let _ = reply.send(NetMsg::Pong(b));
                    }
                    Inbound::Message {
                        msg: NetMsg::Data(_),
                        ..
                    } => {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Inbound::Link { up: true, .. } => {
                        if let Some(tx) = up_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        up.push(up_rx);
        nodes.push((rpc, transport));
    }
    for rx in up {
        tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .map_err(|_| "the two nodes did not connect within 10 s".to_string())?
            .map_err(|_| "a node stopped before connecting".to_string())?;
    }
    Ok((received, nodes))
}

async fn rpc_round_trips(
    rpc: &Rpc<NetMsg>,
    phase: Duration,
    size: usize,
) -> Result<Histogram<u64>, String> {
    let mut h = histogram();
    let end = Instant::now() + phase;
    while Instant::now() < end {
        let t = Instant::now();
        let answer = rpc
            .request(2, NetMsg::Ping(vec![7; size]), Duration::from_secs(5))
            .await
            .map_err(|e| format!("round trip failed: {e}"))?;
        let elapsed = t.elapsed();
        if !matches!(answer, NetMsg::Pong(b) if b.len() == size) {
            return Err("the echo node answered with something else".into());
        }
        let _ = h.record(elapsed.as_nanos() as u64);
    }
    Ok(h)
}

/// Sends from a plain thread (sending never blocks); returns messages received per second and
/// how often the sender had to wait for the queue to drain.
async fn one_way(
    rpc: &Rpc<NetMsg>,
    received: &Arc<AtomicU64>,
    phase: Duration,
    size: usize,
) -> Result<(f64, u64), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (rpc, stop) = (rpc.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut waits = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match rpc.send(2, NetMsg::Data(vec![1; size])) {
                    Ok(()) => {}
                    Err(SendError::Backlog { .. }) => {
                        waits += 1;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    Err(e) => return Err(format!("one-way send failed: {e}")),
                }
            }
            Ok(waits)
        })
    };
    // Count from a moment when the pipe is already full.
    tokio::time::sleep(phase / 10).await;
    let (start_count, start) = (received.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(phase).await;
    let (end_count, elapsed) = (received.load(Ordering::Relaxed), start.elapsed());
    stop.store(true, Ordering::Relaxed);
    let waits = tokio::task::spawn_blocking(move || sender.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the sender panicked".to_string())??;
    Ok((
        (end_count - start_count) as f64 / elapsed.as_secs_f64(),
        waits,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_measures_and_bad_settings_are_refused() {
        let cfg = NetBenchConfig {
            duration: Duration::from_millis(400),
            message_bytes: 64,
            link_delay: Duration::ZERO,
        };
        let r = run(&cfg).expect("ran");
        assert!(
            r.blocking_tcp_rtt_p50_us > 0.0
                && r.blocking_tcp_rtt_p99_us >= r.blocking_tcp_rtt_p50_us
        );
        assert!(r.raw_tcp_rtt_p50_us > 0.0 && r.rtt_p50_us > 0.0 && r.rtt_samples > 0);
        assert!((r.rtt_over_blocking - r.rtt_p50_us / r.blocking_tcp_rtt_p50_us).abs() < 1e-9);
        assert!(r.oneway_msgs_per_s > 0.0);
        for bad in [
            NetBenchConfig {
                duration: Duration::ZERO,
                ..cfg.clone()
            },
            NetBenchConfig {
                message_bytes: 0,
                ..cfg.clone()
            },
            NetBenchConfig {
                message_bytes: MAX_MESSAGE_BYTES + 1,
                ..cfg
            },
        ] {
            assert!(run(&bad).is_err());
        }
    }
}
