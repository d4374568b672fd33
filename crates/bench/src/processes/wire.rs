//! What the parent and its member processes say to each other: one JSON value per line, over
//! each member's standard input and output.

use std::io::{BufRead, Write};
use std::net::SocketAddr;

use atomos::Stats;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// From the parent to a member.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToMember {
    /// Where every member listens (the receiver's own address included): link up.
    Members(Vec<(u64, SocketAddr)>),
    /// Run the workload's setup.
    Setup,
    /// Run the workload for the configured time.
    Run,
    /// Check the workload's invariant.
    Check,
    /// Stop the node and exit.
    Exit,
}

/// From a member to the parent.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromMember {
    /// The member listens on this loopback port.
    Listening(u16),
    /// The member reaches every other one and runs its protocol.
    Ready,
    /// The setup is done.
    SetUp,
    /// What the run measured.
    Ran(Box<MemberRun>),
    /// The invariant held (`true`), or not, with the workload's account of it.
    Checked(bool, String),
    /// The member could not go on.
    Failed(String),
}

/// What one member's workers measured.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MemberRun {
    /// How long the workers ran, in seconds.
    pub(crate) elapsed_s: f64,
    /// The node's engine counters over the run.
    pub(crate) stats: Stats,
    /// Per kind of operation: how many completed and their latency samples (hdrhistogram's V2
    /// encoding).
    pub(crate) tallies: Vec<(u64, Vec<u8>)>,
}

/// Writes `msg` as one line.
pub(crate) fn send<T: Serialize>(out: &mut impl Write, msg: &T) -> Result<(), String> {
    let mut line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
    line.push('\n');
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot send: {e}"))
}

/// Reads one line as a `T`; the end of the input is an error.
pub(crate) fn receive<T: DeserializeOwned>(input: &mut impl BufRead) -> Result<T, String> {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) => Err("the other side closed the pipe".into()),
        Ok(_) => serde_json::from_str(&line).map_err(|e| format!("unreadable message: {e}")),
        Err(e) => Err(format!("cannot receive: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_a_pipe_line_by_line_and_bad_lines_are_errors() {
        let mut pipe = Vec::new();
        send(&mut pipe, &FromMember::Listening(4242)).unwrap();
        send(&mut pipe, &ToMember::Setup).unwrap();
        let mut input = &pipe[..];
        assert!(matches!(
            receive::<FromMember>(&mut input),
            Ok(FromMember::Listening(4242))
        ));
        assert!(matches!(
            receive::<ToMember>(&mut input),
            Ok(ToMember::Setup)
        ));
        assert!(receive::<ToMember>(&mut input).is_err(), "end of input");
        let mut garbage = &b"{\"Run\": 7}\n"[..];
        assert!(receive::<ToMember>(&mut garbage).is_err());
    }
}
