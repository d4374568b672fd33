//! The parts of the TFA simulation (see `tfa_sim.rs`).

mod check;
mod exclusive;
mod node;
mod programs;

pub(crate) use check::*;
pub(crate) use exclusive::*;
pub(crate) use node::*;
pub(crate) use programs::*;
