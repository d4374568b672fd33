//! Where a node starts a hosted protocol (see `crate::host`): its messages taken where they
//! arrive, its timer, its failures reported to the node's health.

use std::path::PathBuf;
use std::sync::Arc;

use atomos_seam::Input;

use super::{NodeRuntime, RuntimeError};
use crate::disk::FsyncPolicy;
use crate::host::{Host, Hosted, SendFn};

impl NodeRuntime {
    /// Starts protocol `P` on this node: its log at `wal` (if any) read back and handed to
    /// `open`, which builds the machine; its messages handled where they arrive; `every_tick`
    /// run after each step of its timer (counters to publish, say). Fails if the log cannot
    /// be opened or read, or `open` fails.
    pub(crate) fn host<P: Hosted>(
        &self,
        wal: Option<&(PathBuf, FsyncPolicy)>,
        open: impl FnOnce(&[Vec<u8>]) -> Result<P, String>,
        mut every_tick: impl FnMut(&Host<P>) + Send + 'static,
    ) -> Result<Arc<Host<P>>, RuntimeError> {
        let rpc = self.rpc().clone();
        let send: SendFn<P> = Box::new(move |to, msg| {
            let _ = rpc.send(to, P::to_wire(msg));
        });
        let host = Host::start(self.id(), wal, open, send, self.health().clone())
            .map_err(|why| RuntimeError::Protocol { name: P::NAME, why })?;
        let inbound = host.clone();
        self.rpc()
            .intercept(Arc::new(move |from, msg| match P::from_wire(msg) {
                Ok(msg) => {
                    inbound.step(Input::Message { from, msg });
                    None
                }
                Err(other) => Some(other),
            }));
        let ticking = host.clone();
        self.every(&format!("{} timer", P::NAME), P::TICK, move || {
            ticking.step(Input::Tick);
            every_tick(&ticking);
        });
        Ok(host)
    }
}
