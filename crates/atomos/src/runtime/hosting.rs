//! Where a node starts a hosted protocol (see `crate::host`): its messages taken where they
//! arrive, its timer, its failures reported to the node's health.

use std::path::PathBuf;
use std::sync::Arc;

use atomos_seam::Input;

use super::{NodeRuntime, RuntimeError};
use crate::disk::FsyncPolicy;
use crate::host::{Host, Hosted, SendFn};

impl NodeRuntime {
    /// Builds protocol `P`'s machine on this node: its log at `wal` (if any) read back and
    /// handed to `open`, which builds it, on the protocol host with its disk thread. It takes
    /// no input until [`NodeRuntime::serve_host`]. Fails if the log cannot be opened or read,
    /// or `open` fails.
    pub(crate) fn host<P: Hosted>(
        &self,
        wal: Option<&(PathBuf, FsyncPolicy)>,
        open: impl FnOnce(&[Vec<u8>]) -> Result<P, String>,
    ) -> Result<Arc<Host<P>>, RuntimeError> {
        let rpc = self.rpc().clone();
        let send: SendFn<P> = Box::new(move |to, msg| {
            let _ = rpc.send(to, P::to_wire(msg));
        });
        Host::start(self.id(), wal, open, send, self.health().clone())
            .map_err(|why| RuntimeError::Protocol { name: P::NAME, why })
    }

    /// Feeds `host` from now on: its messages handled where they arrive, its timer, and
    /// `every_tick` run after each of the timer's steps (counters to publish, say). Fails if
    /// another protocol already takes this node's messages (a node runs one protocol).
    pub(crate) fn serve_host<P: Hosted>(
        &self,
        host: &Arc<Host<P>>,
        mut every_tick: impl FnMut(&Host<P>) + Send + 'static,
    ) -> Result<(), RuntimeError> {
        let inbound = host.clone();
        let taken = self
            .rpc()
            .intercept(Arc::new(move |from, msg| match P::from_wire(msg) {
                Ok(msg) => {
                    inbound.step(Input::Message { from, msg });
                    None
                }
                Err(other) => Some(other),
            }));
        if !taken {
            return Err(RuntimeError::Protocol {
                name: P::NAME,
                why: "another protocol already takes this node's messages".into(),
            });
        }
        let ticking = host.clone();
        self.every(&format!("{} timer", P::NAME), P::TICK, move || {
            ticking.step(Input::Tick);
            every_tick(&ticking);
        });
        Ok(())
    }
}
