//! TFA nodes driven by hand through chosen message losses: objects move to their writer, the
//! directory follows, locks of a committer that crashed or was cut off are not held forever,
//! and an unreachable owner fails a transaction with a clear error instead of hanging.

mod abstract_and_runs;
mod commits;
mod forwarding;
mod locks;
mod net;
