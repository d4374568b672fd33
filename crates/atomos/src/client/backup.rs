//! Backups fetched by a client (`atomos backup`): one member takes it, the client fetches it
//! by chunks into a file and checks it before it calls it done.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use atomos_net::transport::NodeId;
use tokio::time::Instant;

use super::{Client, ClientError};
use crate::backup::{Backup, BackupHeader};
use crate::backups::CHUNK_MAX;
use crate::wire::{BackupOffer, NodeMsg};

/// How long a client waits for one chunk.
const CHUNK_WAIT: Duration = Duration::from_secs(10);

impl Client {
    /// Takes a backup of the cluster and writes it to `out`, asking each member in turn until
    /// one serves it (each within what is left of `wait`): everything the cluster
    /// acknowledged before this call is in it. The file is written beside `out` and renamed
    /// over it once whole and checked (see [`Backup::read`]); returns its header.
    pub async fn backup(&self, out: &Path, wait: Duration) -> Result<BackupHeader, ClientError> {
        let deadline = Instant::now() + wait;
        let mut said = Vec::new();
        for (member, _) in self.members() {
            if Instant::now() >= deadline {
                break;
            }
            match self.backup_from(member, out, deadline).await {
                Ok(header) => return Ok(header),
                Err(e) => said.push(format!("member {member}: {e}")),
            }
        }
        said.reverse();
        if said.is_empty() {
            said.push(format!("no member asked within {wait:?}"));
        }
        Err(ClientError::Backup(said.join("; ")))
    }

    async fn backup_from(
        &self,
        member: NodeId,
        out: &Path,
        deadline: Instant,
    ) -> Result<BackupHeader, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        let offer = match self.rpc.request(member, NodeMsg::BackupBegin, left).await {
            Ok(NodeMsg::BackupReady(Ok(offer))) => offer,
            Ok(NodeMsg::BackupReady(Err(refusal))) => return Err(format!("{refusal:?}")),
            Ok(other) => return Err(format!("answered {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let mut partial = out.as_os_str().to_owned();
        partial.push(".partial");
        let partial = std::path::PathBuf::from(partial);
        let fetched = self.fetch(member, &offer, &partial, deadline).await;
        let checked = fetched
            .and_then(|()| Backup::read(&partial).map_err(|e| e.to_string()))
            .and_then(|backup| match backup.header == offer.header {
                true => Ok(backup),
                false => Err("the file's header is not the one the member offered".into()),
            });
        let checked = match checked {
            Ok(backup) => backup,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(checked.header)
    }

    /// Fetches backup `offer` from `member` into `partial`, each chunk within what is left of
    /// `deadline` (and [`CHUNK_WAIT`]).
    async fn fetch(
        &self,
        member: NodeId,
        offer: &BackupOffer,
        partial: &Path,
        deadline: Instant,
    ) -> Result<(), String> {
        let mut file =
            std::fs::File::create(partial).map_err(|e| format!("{}: {e}", partial.display()))?;
        let mut offset = 0;
        while offset < offer.total {
            let fetch = NodeMsg::BackupFetch {
                id: offer.id,
                offset,
                len: CHUNK_MAX,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "fetched {offset} of {} bytes in the time given",
                    offer.total
                ));
            }
            let bytes = match self.rpc.request(member, fetch, CHUNK_WAIT.min(left)).await {
                Ok(NodeMsg::BackupChunk(Ok(bytes))) if !bytes.is_empty() => bytes,
                Ok(NodeMsg::BackupChunk(Ok(_))) => {
                    return Err(format!("no bytes at {offset} of {}", offer.total))
                }
                Ok(NodeMsg::BackupChunk(Err(refusal))) => return Err(format!("{refusal:?}")),
                Ok(other) => return Err(format!("answered {other:?}")),
                Err(e) => return Err(format!("at {offset} of {}: {e}", offer.total)),
            };
            file.write_all(&bytes)
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            offset += bytes.len() as u64;
        }
        file.sync_all()
            .map_err(|e| format!("{}: {e}", partial.display()))
    }
}
