//! TFA (HyflowCPP thesis, chapter 5): objects live on one owner node at a time and move to the
//! node that commits a write to them; transactions stay opaque across nodes with node clocks
//! instead of a global one.
//!
//! - [`clock`]: each node's clock, advanced by its write commits and by larger clocks seen in
//!   messages; the forwarding rule of figure 5.1.
//! - [`directory`]: where an object lives: its home node (by hash of its key) tracks the current
//!   owner; other nodes cache owners and correct the cache when redirected.
//! - [`owner`]: the objects a node owns, with versions and commit locks that expire, so a
//!   committer that crashed or was cut off never holds a lock forever.

pub mod clock;
pub mod directory;
pub mod owner;
