//! The signal every long-running command of the control plane stops on.

/// Resolves on SIGTERM or SIGINT; never, when the handlers cannot be installed
/// (the process then stops only when killed).
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
