//! The congestion control of the TCP sockets that carry virtual links and
//! max-mode hops.
//!
//! They keep the namespace's default unless `NEXTMINI_LINK_CONGESTION` (agent
//! environment, read once) names an algorithm. Which one is best depends on
//! the emulated flows' own algorithm and on whether the links are shaped, so
//! there is no fixed choice (measured on 2 cores with this host's default,
//! BBR, for the flows; BENCHMARKS.md "Transit hops: congestion control"):
//! through 40 unshaped hops with the flow on CUBIC, links on CUBIC carried
//! 33–49 MB/s against 25–34 on BBR, while across the shaped fat-tree a flow on
//! BBR got 198–250 Mbit/s of 289 over CUBIC links against 259–283 over BBR
//! links. The variable is for such comparisons.

use std::os::fd::AsFd;

/// The algorithm link sockets get, `None` to leave the namespace's default.
fn for_links() -> Option<&'static str> {
    static CHOICE: std::sync::LazyLock<Option<String>> = std::sync::LazyLock::new(|| {
        choice(std::env::var("NEXTMINI_LINK_CONGESTION").ok().as_deref())
    });
    CHOICE.as_deref()
}

/// `NEXTMINI_LINK_CONGESTION`'s value as a choice: unset, empty or `default`
/// leave the namespace's own.
fn choice(value: Option<&str>) -> Option<String> {
    match value.map(str::trim) {
        None | Some("" | "default") => None,
        Some(name) => Some(name.to_string()),
    }
}

/// Puts a link socket on [`for_links`]'s algorithm, if one was chosen.
pub fn apply_to_link(socket: &impl AsFd) {
    if let Some(name) = for_links() {
        apply(socket, name);
    }
}

/// A kernel that refuses the algorithm (not built or not allowed) leaves the
/// socket as it was, which still forwards: logged once, not an error.
fn apply(socket: &impl AsFd, name: &str) {
    if let Err(e) = set(socket, name) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(algorithm = name, error = %e, "link sockets keep the namespace's congestion control")
        });
    }
}

/// Sets a TCP socket's congestion control by name.
fn set(socket: &impl AsFd, name: &str) -> nix::Result<()> {
    nix::sys::socket::setsockopt(
        socket,
        nix::sys::socket::sockopt::TcpCongestion,
        &std::ffi::OsString::from(name),
    )
}

/// A TCP socket's congestion control.
#[cfg(test)]
fn get(socket: &impl AsFd) -> nix::Result<String> {
    let name = nix::sys::socket::getsockopt(socket, nix::sys::socket::sockopt::TcpCongestion)?;
    Ok(name.to_string_lossy().trim_end_matches('\0').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_algorithm_overrides_the_namespace() {
        assert_eq!(choice(None), None);
        assert_eq!(choice(Some("")), None);
        assert_eq!(choice(Some("default")), None);
        assert_eq!(choice(Some("cubic")).as_deref(), Some("cubic"));
    }

    #[tokio::test]
    async fn a_chosen_algorithm_reaches_both_ends_of_a_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (dialed, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (dialed, (accepted, _)) = (dialed.expect("connect"), accepted.expect("accept"));
        // Reno and CUBIC are built into every mainstream kernel; whichever the
        // default is, one of the two steps below changes it.
        for name in ["reno", "cubic"] {
            apply(&dialed, name);
            apply(&accepted, name);
            assert_eq!(get(&dialed).expect("get"), name);
            assert_eq!(get(&accepted).expect("get"), name);
        }
        // A name the kernel does not know leaves the socket as it was.
        apply(&dialed, "no-such-algorithm");
        assert_eq!(get(&dialed).expect("get"), "cubic");
    }
}
