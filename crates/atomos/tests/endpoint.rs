//! The node's HTTP endpoint: `/metrics`, `/health` and `/ready` answer GET and HEAD whatever
//! the query string, a failed node's health is 503, a node whose probe says it is not ready is
//! 503 on `/ready` with the reason, other paths 404 and other methods 405.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use atomos::health::Health;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Sends `request` and returns the status code and the body.
fn ask(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(format!("{request}\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[test]
fn metrics_and_health_answer_get_and_head_and_nothing_else() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("atomos_example_total").increment(3);
    });
    let health = Health::new();
    let addr = runtime
        .block_on(atomos::endpoint::serve(
            "127.0.0.1:0".parse().unwrap(),
            handle,
            health.clone(),
        ))
        .unwrap();
    let (status, body) = ask(addr, "GET /metrics?x=1 HTTP/1.1");
    assert_eq!(status, 200);
    assert!(body.contains("atomos_example_total 3"), "{body}");
    assert_eq!(ask(addr, "GET /health HTTP/1.1"), (200, "ok\n".into()));
    assert_eq!(
        ask(addr, "GET /ready HTTP/1.1"),
        (200, "ready\n".into()),
        "no probe: ready"
    );
    let not_yet = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe = not_yet.clone();
    health.set_replica(Arc::new(move || atomos::status::ReplicaStatus {
        not_ready: probe
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| "no leader known".to_string()),
        ..atomos::status::ReplicaStatus::default()
    }));
    assert_eq!(
        ask(addr, "GET /ready HTTP/1.1"),
        (503, "not ready: no leader known\n".into())
    );
    assert_eq!(
        ask(addr, "GET /health HTTP/1.1").0,
        200,
        "healthy all the same"
    );
    not_yet.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(ask(addr, "GET /ready HTTP/1.1").0, 200);
    assert_eq!(ask(addr, "HEAD /health HTTP/1.1"), (200, String::new()));
    assert_eq!(ask(addr, "GET /nope HTTP/1.1").0, 404);
    assert_eq!(ask(addr, "POST /health HTTP/1.1").0, 405);
    assert_eq!(ask(addr, "garbage").0, 400);
    health.fail("disk", "fsync failed");
    let (status, body) = ask(addr, "GET /health HTTP/1.1");
    assert_eq!(status, 503);
    assert!(body.contains("fsync failed"), "{body}");
    let (status, body) = ask(addr, "GET /ready HTTP/1.1");
    assert_eq!(status, 503, "a failed node is not ready");
    assert!(body.contains("fsync failed"), "{body}");
    let _keep: Arc<Health> = health;
}
