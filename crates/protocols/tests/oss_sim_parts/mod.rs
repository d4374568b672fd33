//! The parts of the OSS simulation (see `oss_sim.rs`).

mod node;
mod objects;
mod run;

pub(crate) use node::*;
pub(crate) use objects::*;
pub(crate) use run::*;
