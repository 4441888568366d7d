//! Clean-up on Ctrl-C or SIGTERM for the benchmark binaries. Drop guards do not
//! run when a signal kills the process, so whatever a benchmark creates
//! (namespaces, topologies, servers) registers how to remove it here; a thread
//! waiting for SIGINT/SIGTERM/SIGHUP runs every registered action and exits.
//! Drop guards deregister their action once they have cleaned up themselves.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

type Action = Box<dyn FnMut() + Send>;

static ACTIONS: Mutex<Vec<(u64, Action)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);
static INSTALLED: std::sync::Once = std::sync::Once::new();

/// Handle of a registered action; [`forget`] removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration(u64);

/// Runs `action` if the process is interrupted before [`forget`] is called.
pub fn on_interrupt(action: impl FnMut() + Send + 'static) -> Registration {
    install();
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock().push((id, Box::new(action)));
    Registration(id)
}

pub fn forget(registration: Registration) {
    lock().retain(|(id, _)| *id != registration.0);
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(u64, Action)>> {
    // A panic while holding the lock must not stop clean-up.
    ACTIONS.lock().unwrap_or_else(|e| e.into_inner())
}

fn install() {
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("warning: cannot catch signals ({e}); an interrupted run may leave namespaces behind");
                return;
            }
        };
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("\ninterrupted (signal {signal}): cleaning up");
                // Newest first: a topology's servers go before the topology.
                let mut actions = std::mem::take(&mut *lock());
                while let Some((_, mut action)) = actions.pop() {
                    action();
                }
                std::process::exit(128 + signal);
            }
        });
    });
}
