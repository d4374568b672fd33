//! OSS (the Object Sharing Service's commit protocols; see docs/design/oss.md): every node
//! holds every replicated object, one sequencer per consistency domain numbers the commits,
//! and write sets go to every node directly, applied in commit-id order once a majority holds
//! them. Being built; so far:
//!
//! - [`write_set`]: what a commit sends to every node, and the ids that name it.
//! - [`domain_log`]: one domain's write sets on one node: reorder buffer, held and stable
//!   watermarks, history for others, epochs' fences and starts.
//! - [`control`]: the epochs of every domain, agreed through the order layer.
//! - [`msg`]: messages, log records and deliveries.
//! - [`node`]: one node as a seam machine: local commits, commits through the sequencer,
//!   write sets installed once stable, the control log's replica beside (`commit`,
//!   `sequencing`, `epochs` hold its parts).
//! - [`sequencer`]: numbering one domain's commits with backward validation, as the token
//!   holder and the ultra-peer coordinator both do.
//! - [`image`]: catching up from an image of a domain when no node keeps the write sets a
//!   node lacks.
//! - `compaction`: replacing the log with what rebuilds the node as it is.
//! - `token`: peer-to-peer commit, the token passed between nodes (distributed or through a
//!   coordinator).

mod commit;
mod compaction;
mod config;
pub mod control;
pub mod domain_log;
mod epochs;
pub mod image;
pub mod msg;
pub mod node;
mod recovery;
pub mod sequencer;
mod sequencing;
mod token;
mod token_state;
mod vocabulary;
pub mod write_set;

pub use config::{CommitMode, OssBug, OssConfig};
pub use control::{Control, ControlEntry, ControlEvent, DomainState};
pub use domain_log::{DomainLog, Offer};
pub use image::{DomainImage, ImagePart};
pub use msg::{AbortReason, OssDelivery, OssMsg, OssRecord, Token};
pub use node::OssNode;
pub use sequencer::{CommitRequest, Conflict, Sequencer};
pub use vocabulary::{OssCounters, OssError, OssOutput, OssRequest};
pub use write_set::{CommitId, DomainId, Epoch, TxId, WriteSet};
