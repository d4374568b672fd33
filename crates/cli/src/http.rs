//! The node's HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /health` (200 `ok`, or
//! 503 with the failure that is stopping the node). One request per connection, read with a
//! size and time limit, at most 32 connections at once; anything else gets 404 or 400.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atomos::health::Health;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Largest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// Connections answered at once.
const MAX_CONNECTIONS: usize = 32;

/// Binds `addr` and serves until the runtime stops; histograms' upkeep runs every 5 s.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: wait, and go on serving.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Beyond the limit a connection is closed at once rather than held.
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let (metrics, health) = (metrics.clone(), health.clone());
            tokio::spawn(async move {
                let answered = answer(stream, &metrics, &health);
                let _ = tokio::time::timeout(Duration::from_secs(5), answered).await;
                drop(slot);
            });
        }
    });
    Ok(local)
}

async fn answer(
    mut stream: TcpStream,
    metrics: &PrometheusHandle,
    health: &Health,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(&mut stream, 400, "request too large\n").await;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next(), parts.next());
    match (method, path) {
        (Some("GET"), Some("/metrics")) => respond(&mut stream, 200, &metrics.render()).await,
        (Some("GET"), Some("/health")) => match health.failure() {
            None => respond(&mut stream, 200, "ok\n").await,
            Some(f) => respond(&mut stream, 503, &format!("failed: {f}\n")).await,
        },
        (Some(_), Some(_)) => {
            respond(&mut stream, 404, "not found: try /metrics or /health\n").await
        }
        _ => respond(&mut stream, 400, "bad request\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
