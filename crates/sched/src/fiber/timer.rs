//! The timer that wakes a suspended fiber at its wait's deadline: the Tokio runtime's, when the
//! fiber is polled inside one and the `tokio-timer` feature is on (the node runtime turns it
//! on); otherwise none, and the fiber looks at the clock whenever it is polled. Without the
//! feature this crate does not depend on Tokio, so the engine and the protocols built on it
//! stay free of an async runtime.

use std::task::Context;
use std::time::Instant;

/// A fiber's deadline timer.
#[derive(Default)]
pub(super) struct Timer {
    #[cfg(feature = "tokio-timer")]
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Timer {
    /// Whether a timer runs for the current wait (it wakes the task at the deadline).
    pub(super) fn armed(&self) -> bool {
        #[cfg(feature = "tokio-timer")]
        return self.sleep.is_some();
        #[cfg(not(feature = "tokio-timer"))]
        false
    }

    /// Whether `deadline` passed; if not and a timer can run here, it wakes `cx`'s task then.
    pub(super) fn passed(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        if Instant::now() >= deadline {
            return true;
        }
        self.arm(cx, deadline)
    }

    #[cfg(feature = "tokio-timer")]
    fn arm(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        use std::future::Future as _;
        if tokio::runtime::Handle::try_current().is_err() {
            return false;
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                if sleep.deadline() != deadline {
                    sleep.as_mut().reset(deadline);
                }
                sleep
            }
            None => self
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        sleep.as_mut().poll(cx).is_ready()
    }

    #[cfg(not(feature = "tokio-timer"))]
    fn arm(&mut self, _cx: &mut Context<'_>, _deadline: Instant) -> bool {
        false
    }
}
