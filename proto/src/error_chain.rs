//! An error as one line with every cause it wraps: transport errors (tonic's
//! "transport error", hyper's "client error (Connect)") say what failed only
//! in their sources.

/// `error: cause: cause ...`, each cause once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
