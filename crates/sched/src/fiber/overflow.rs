//! A fiber that overflows its stack ends the process with a message that says so, as a thread
//! that overflows its own does, rather than with a bare segmentation fault.
//!
//! Every fiber stack has a guard page below it, mapped with no access. The poller of a fiber
//! notes, in a thread-local, where the guard page of the fiber it runs lies. A handler for
//! SIGSEGV and SIGBUS, installed with the first fiber, looks there: a fault in that page is an
//! overflow, which it reports before aborting; any other fault goes to the handler installed
//! before (the standard library's, which reports thread stack overflows, or the default
//! action). The handler runs on the thread's alternate signal stack, which the standard
//! library gives the threads it spawns; a thread without one dies of the fault unreported.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

thread_local! {
    /// The lowest address of the guard page of the fiber this thread runs (0 outside fibers).
    static GUARD: Cell<usize> = const { Cell::new(0) };
}

/// The size of a page (the guard's size), set once the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// The actions for SIGSEGV and SIGBUS that were in place before ours.
static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();

const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// What the process prints as it aborts.
const MESSAGE: &[u8] = b"\natomos: a fiber overflowed its stack (deep recursion and large \
locals belong on a thread of their own)\nfatal runtime error: fiber stack overflow, aborting\n";

static INSTALL: Once = Once::new();

/// Installs the handler, once per process. The actions it replaces are known before it is
/// in place, so that a fault on another thread meanwhile still reaches them.
pub(super) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `sysconf` has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        PAGE.store(usize::try_from(page).unwrap_or(4096), Ordering::Relaxed);
        let mut previous = [MaybeUninit::<libc::sigaction>::zeroed(); 2];
        for (signal, previous) in SIGNALS.iter().zip(&mut previous) {
            // SAFETY: with no new action, `sigaction` only writes the current one into memory
            // we own (left zeroed, the default action, if it fails).
            unsafe { libc::sigaction(*signal, std::ptr::null(), previous.as_mut_ptr()) };
        }
        // SAFETY: both were written by `sigaction` or are zeroed, valid values either way.
        let _ = PREVIOUS.set(previous.map(|p| unsafe { p.assume_init() }));
        for signal in SIGNALS {
            // SAFETY: a zeroed `sigaction` is a valid value, completed here.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    on_fault;
                action.sa_sigaction = handler as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

/// Notes that this thread runs the fiber whose stack starts at `stack_limit` (0: none) until
/// the next call, and returns what was noted before.
#[inline(never)]
pub(super) fn enter(stack_limit: usize) -> usize {
    GUARD.with(|g| g.replace(stack_limit))
}

extern "C" fn on_fault(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let address = unsafe { (*info).si_addr() } as usize;
    let guard = GUARD.with(Cell::get);
    let page = PAGE.load(Ordering::Relaxed);
    if guard != 0 && address >= guard && address - guard < page {
        // SAFETY: `write` and `abort` are async-signal-safe.
        unsafe {
            libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
            libc::abort();
        }
    }
    pass_on(signal, info, context);
}

/// Hands a fault that is not a fiber's overflow to the action in place before ours; with none,
/// restores the default action, so that the fault, happening again as the handler returns,
/// ends the process as it would have.
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS
        .get()
        .and_then(|p| SIGNALS.iter().position(|s| *s == signal).map(|i| p[i]));
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: a zeroed `sigaction` with SIG_DFL is the default action; `sigaction` is
        // async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        return;
    }
    let siginfo = previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0);
    // SAFETY: the previous handler was installed for this signal with these flags, so it has
    // the signature they say.
    unsafe {
        if siginfo {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(signal, info, context);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(signal);
        }
    }
}
