//! A node's HTTP endpoint, for a node process and for an application that embeds a node alike:
//! `/metrics` (Prometheus text, from the recorder [`install_recorder`] installed), `/health`
//! (200 `ok`, or 503 with the failure that is stopping the node) and `/ready` (200 `ready` when
//! the node is healthy and its replica, if it has one, follows a leader and has applied what it
//! knows committed; else 503 with why not); GET and HEAD, query strings
//! ignored, anything else 404 (405 for other methods). Served by axum (hyper underneath), at
//! most [`MAX_CONNECTIONS`] requests at once, each answered within [`REQUEST_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::net::TcpListener;

use crate::health::Health;

/// Requests served at once; more wait for a turn.
pub const MAX_CONNECTIONS: usize = 32;

/// How long one request may take before it is answered 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Installs the process's metrics recorder (Prometheus, with atomos's latency buckets from
/// 50 us to 5 s, and gauges that stop being updated dropped after 10 s so the hot spots'
/// series stay bounded), and returns the handle that renders it. Call it before the node
/// starts, so every counter it registers is recorded. Fails if a recorder is installed.
pub fn install_recorder() -> Result<PrometheusHandle, String> {
    let buckets = [
        50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 100e-3, 500e-3, 1.0, 5.0,
    ];
    let mut builder = PrometheusBuilder::new();
    for name in [
        "atomos_request_latency_seconds",
        "atomos_order_opt_to_final_seconds",
        "atomos_wal_fsync_seconds",
    ] {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.into()), &buckets)
            .map_err(|e| format!("metrics buckets: {e}"))?;
    }
    builder
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(10)))
        .install_recorder()
        .map_err(|e| format!("cannot record metrics: {e}"))
}

/// What the endpoint's handlers read.
#[derive(Clone)]
struct Served {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// Binds `addr` and serves `/metrics`, `/health` and `/ready` on the current tokio runtime until it
/// stops; returns the bound address (port 0 picks one). The recorder's upkeep (histograms'
/// expiry) runs every 5 s.
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
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/health", get(report_health))
        .route("/ready", get(report_ready))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: try /metrics, /health or /ready\n",
            )
        })
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(|_| async {
                    (StatusCode::REQUEST_TIMEOUT, "the request took too long\n")
                }))
                .timeout(REQUEST_TIMEOUT)
                .concurrency_limit(MAX_CONNECTIONS),
        )
        .with_state(Served { metrics, health });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(local)
}

async fn render_metrics(State(s): State<Served>) -> String {
    s.metrics.render()
}

async fn report_ready(State(s): State<Served>) -> (StatusCode, String) {
    match s.health.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn report_health(State(s): State<Served>) -> (StatusCode, String) {
    match s.health.failure() {
        None => (StatusCode::OK, "ok\n".into()),
        Some(f) => (StatusCode::SERVICE_UNAVAILABLE, format!("failed: {f}\n")),
    }
}
