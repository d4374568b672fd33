//! A member process of a multi-process benchmark: one node, its share of the workers, and
//! whatever the parent asks of it (see [`super::wire`]).

use std::io::{BufRead, Write};
use std::time::Instant;

use super::wire::{receive, send, FromMember, MemberRun, ToMember};
use crate::harness::{closed_loop, cluster_spec, workload_for, BenchConfig, BenchError};
use crate::BenchNodes;

/// Runs member `index` (node `index + 1`) of `cfg`'s cluster, speaking to the parent over
/// `input` and `out` until it says to exit. A failure is also reported to the parent.
pub fn serve(
    cfg: &BenchConfig,
    index: usize,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<(), BenchError> {
    let result = run_member(cfg, index, input, out);
    if let Err(e) = &result {
        // The parent may be gone already; the error is returned either way.
        let _ = send(out, &FromMember::Failed(e.to_string()));
    }
    result
}

fn run_member(
    cfg: &BenchConfig,
    index: usize,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<(), BenchError> {
    let config = BenchError::Config;
    if index >= cfg.nodes {
        return Err(config(format!(
            "member {index} of a cluster of {} nodes",
            cfg.nodes
        )));
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| config(format!("cannot listen on loopback: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| config(e.to_string()))?
        .port();
    send(out, &FromMember::Listening(port)).map_err(config)?;
    let addrs = match receive(input).map_err(config)? {
        ToMember::Members(addrs) => addrs,
        other => return Err(config(format!("expected the members, got {other:?}"))),
    };
    let id = index as u64 + 1;
    let cluster = BenchNodes::member(&cluster_spec(cfg), id, listener, &addrs).map_err(config)?;
    let node = cluster.nodes()[0].clone();
    let slots = cfg.threads * cfg.nodes;
    let workload = workload_for(cfg, slots, cfg.nodes)?;
    workload
        .register(&node)
        .map_err(|e| config(e.to_string()))?;
    send(out, &FromMember::Ready).map_err(config)?;
    let quiet = BenchConfig {
        progress: false,
        ..cfg.clone()
    };
    loop {
        match receive(input).map_err(config)? {
            ToMember::Setup => {
                workload.setup(&node)?;
                node.sync()?;
                send(out, &FromMember::SetUp).map_err(config)?;
            }
            ToMember::Run => {
                // Under a replicated protocol this replica starts from the whole setup.
                node.sync()?;
                // Worker `t` of the cluster runs on node `t % nodes`, as in one process.
                let workers = (index..slots)
                    .step_by(cfg.nodes)
                    .map(|t| (t, node.clone()))
                    .collect();
                let before = node.stats();
                let start = Instant::now();
                let tallies = closed_loop(&quiet, workers, &workload, cluster.runtime())?;
                let elapsed_s = start.elapsed().as_secs_f64();
                let stats = node.stats().since(&before);
                let tallies = tallies
                    .iter()
                    .map(|t| t.encoded_samples().map(|bytes| (t.ops, bytes)))
                    .collect::<Result<_, _>>()
                    .map_err(config)?;
                let run = MemberRun {
                    elapsed_s,
                    stats,
                    tallies,
                };
                send(out, &FromMember::Ran(Box::new(run))).map_err(config)?;
            }
            ToMember::Check => {
                node.sync()?;
                let check = workload.check(&node)?;
                send(out, &FromMember::Checked(check.ok, check.detail)).map_err(config)?;
            }
            ToMember::Exit => return Ok(()),
            other @ ToMember::Members(_) => {
                return Err(config(format!("unexpected {other:?}")));
            }
        }
    }
}
