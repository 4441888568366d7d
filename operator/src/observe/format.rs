//! Human-readable figures for the CLI and the graph pages.

use super::load::DirectionLoad;

/// `9.63 Mbit/s`, `512 bit/s`.
pub fn rate(bps: f64) -> String {
    const UNITS: [&str; 5] = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
    let mut v = bps.max(0.0);
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} {}", UNITS[0])
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// The measured rate, with the utilisation when the rate is shaped:
/// `9.63 Mbit/s (96%)`, `1.20 Mbit/s`, or `-` before two reports exist.
pub fn load(d: &DirectionLoad) -> String {
    match (d.rate_bps, d.utilisation()) {
        (Some(r), Some(u)) => format!("{} ({:.0}%)", rate(r), u * 100.0),
        (Some(r), None) => rate(r),
        (None, _) => "-".into(),
    }
}

/// Colour of a link direction by utilisation: green (idle) to red (full);
/// blue when unshaped (no utilisation), grey when down or unmeasured.
pub fn colour(d: &DirectionLoad, up: bool) -> &'static str {
    if !up {
        return "#9e9e9e";
    }
    match (d.rate_bps, d.utilisation()) {
        (None, _) => "#78909c",
        (Some(_), None) => "#1e88e5",
        (Some(_), Some(u)) if u < 0.25 => "#43a047",
        (Some(_), Some(u)) if u < 0.5 => "#9ccc65",
        (Some(_), Some(u)) if u < 0.75 => "#fdd835",
        (Some(_), Some(u)) if u < 0.9 => "#fb8c00",
        (Some(_), Some(_)) => "#e53935",
    }
}

/// A bar of `width` cells filled by `fraction` (clamped to 0..=1).
pub fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(filled), "·".repeat(width - filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_like_iperf() {
        assert_eq!(rate(0.0), "0 bit/s");
        assert_eq!(rate(999.0), "999 bit/s");
        assert_eq!(rate(9_630_000.0), "9.63 Mbit/s");
        assert_eq!(rate(481_430_000.0), "481 Mbit/s");
    }

    #[test]
    fn colours_follow_utilisation() {
        let mut d = DirectionLoad {
            rate_bps: Some(9.5e6),
            configured_bps: Some(10_000_000),
            ..DirectionLoad::default()
        };
        assert_eq!(colour(&d, true), "#e53935");
        assert_eq!(colour(&d, false), "#9e9e9e");
        d.configured_bps = None;
        assert_eq!(colour(&d, true), "#1e88e5");
        assert_eq!(bar(0.5, 4), "██··");
        assert_eq!(bar(7.0, 2), "██");
    }
}
