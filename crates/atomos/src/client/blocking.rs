//! [`BlockingClient`]: the remote client for programs without an async runtime. It owns a
//! small runtime of its own and waits for each call on the calling thread.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Client, ClientConfig, ClientError};
use crate::backup::BackupHeader;
use crate::status::MemberReport;

/// A [`Client`] whose calls block the calling thread until they end. Its connections run on a
/// runtime it owns (two worker threads). Calls from several threads share one client; a call
/// made from inside an async runtime's worker fails with [`ClientError::Config`] instead of
/// blocking that worker. Dropping it closes the connections.
pub struct BlockingClient {
    client: Arc<Client>,
    /// Taken only when dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl BlockingClient {
    /// Starts the client's runtime and connects (see [`Client::connect`]).
    pub fn connect(cfg: ClientConfig) -> Result<BlockingClient, ClientError> {
        not_in_a_runtime()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("atomos-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("cannot start the client's runtime: {e}")))?;
        let client = runtime.block_on(Client::connect(cfg))?;
        Ok(BlockingClient {
            client: Arc::new(client),
            runtime: Some(runtime),
        })
    }

    /// The async client underneath, to hand to code that has a runtime.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// [`Client::invoke`], waiting for its result.
    pub fn invoke<A, R>(&self, name: &str, args: &A) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        self.wait(self.client.invoke(name, args))
    }

    /// [`Client::submit`], waiting for its result.
    pub fn submit<A, R>(&self, name: &str, args: &A, priority: u8) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        self.wait(self.client.submit(name, args, priority))
    }

    /// [`Client::status`], waiting up to `wait` for the members' answers.
    pub fn status(&self, wait: Duration) -> Result<Vec<MemberReport>, ClientError> {
        self.wait(async { Ok(self.client.status(wait).await) })
    }

    /// [`Client::backup`] into `out`.
    pub fn backup(&self, out: &Path, wait: Duration) -> Result<BackupHeader, ClientError> {
        self.wait(self.client.backup(out, wait))
    }

    /// Closes the connections; calls waiting fail with [`ClientError::Closed`].
    pub fn close(&self) {
        self.client.close();
    }
}

impl Drop for BlockingClient {
    /// Closes the connections and lets the runtime's threads end on their own, so that a
    /// client dropped anywhere (even inside another runtime) never blocks.
    fn drop(&mut self) {
        self.client.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl BlockingClient {
    /// Runs `call` to its end on the client's runtime, unless called inside an async runtime.
    fn wait<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        not_in_a_runtime()?;
        match &self.runtime {
            Some(runtime) => runtime.block_on(call),
            None => Err(ClientError::Closed),
        }
    }
}

/// Refuses a blocking call from inside an async runtime, where it would stall a worker (and
/// `block_on` would panic).
fn not_in_a_runtime() -> Result<(), ClientError> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Err(ClientError::Config(
            "a blocking client was called from inside an async runtime: use the async `Client` \
             there (`BlockingClient::client`)"
                .into(),
        )),
        Err(_) => Ok(()),
    }
}
