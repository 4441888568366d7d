//! Human units as users write them in YAML (`100Mbit`, `10ms`, `0.5%`, `1000pkt`, `500m`,
//! `0.002`).
//!
//! Each type parses from and displays as a string, (de)serializes as that string and
//! describes itself to the CRD schema as a string with a `pattern`, so the API server
//! rejects garbage before the operator ever sees it. Numbers are parsed as exact
//! decimals (never through `f64`) so `1.1Gbit` is exactly 1 100 000 000 bit/s.
//! `Fraction` is the one plain number: it serializes as a JSON number, since that is what
//! users write for RED's weight, and parses from a string too.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// A value that could not be parsed, with what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {input:?}: {problem}")]
pub struct UnitError {
    /// What was being parsed: "rate", "duration", "percentage", "size", "cpu".
    pub kind: &'static str,
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub problem: Problem,
}

/// Why a unit string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("it is empty (expected e.g. {example})")]
    Empty { example: &'static str },
    #[error("negative values are not allowed")]
    Negative,
    #[error("it must start with a number, e.g. {example}")]
    NotANumber { example: &'static str },
    #[error("a unit is required (e.g. {example})")]
    MissingUnit { example: &'static str },
    #[error("unknown unit {unit:?}; expected {expected}")]
    UnknownUnit {
        unit: String,
        expected: &'static str,
    },
    #[error(
        "{unit:?} would be bytes per second, which is easy to misread; write bits per second (e.g. 100Mbit)"
    )]
    BytesPerSecond { unit: String },
    #[error("it is not a whole number of {base}")]
    Fractional { base: &'static str },
    #[error("it exceeds the maximum of {max}")]
    TooLarge { max: &'static str },
}

/// Exact decimal `digits / 10^scale`, split from its unit suffix.
struct Number<'a> {
    digits: u128,
    scale: u32,
    unit: &'a str,
}

/// Splits `"1.5Gbit"` into 15, scale 1, unit `"Gbit"`.
fn split_number<'a>(
    kind: &'static str,
    input: &'a str,
    example: &'static str,
) -> Result<Number<'a>, UnitError> {
    let fail = |problem| UnitError {
        kind,
        input: input.to_owned(),
        problem,
    };
    if input.is_empty() {
        return Err(fail(Problem::Empty { example }));
    }
    if input.starts_with('-') {
        return Err(fail(Problem::Negative));
    }
    let int_len = input.bytes().take_while(u8::is_ascii_digit).count();
    if int_len == 0 {
        return Err(fail(Problem::NotANumber { example }));
    }
    let (int_part, rest) = input.split_at(int_len);
    let (frac_part, unit) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            if frac_len == 0 {
                return Err(fail(Problem::NotANumber { example }));
            }
            after_dot.split_at(frac_len)
        }
        None => ("", rest),
    };
    // 38 digits always fit in a u128; anything longer is absurd for every unit here.
    if int_part.len() + frac_part.len() > 38 {
        return Err(fail(Problem::TooLarge { max: "38 digits" }));
    }
    let mut digits: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        digits = digits * 10 + u128::from(b - b'0');
    }
    let scale = u32::try_from(frac_part.len()).unwrap_or(u32::MAX);
    Ok(Number {
        digits,
        scale,
        unit,
    })
}

impl Number<'_> {
    /// `self * multiplier`, which must come out as a whole number of `base`.
    fn times(
        &self,
        multiplier: u128,
        base: &'static str,
        max: &'static str,
    ) -> Result<u128, Problem> {
        let scaled = self
            .digits
            .checked_mul(multiplier)
            .ok_or(Problem::TooLarge { max })?;
        // scale <= 38 (checked in split_number), so the power always fits.
        let divisor = 10u128
            .checked_pow(self.scale)
            .ok_or(Problem::TooLarge { max })?;
        if scaled % divisor == 0 {
            Ok(scaled / divisor)
        } else {
            Err(Problem::Fractional { base })
        }
    }
}

/// Looks `unit` up case-insensitively.
fn lookup(table: &[(&str, u128)], unit: &str) -> Option<u128> {
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|&(_, m)| m)
}

/// Formats `value / unit` exactly, trimming trailing zeros of the fraction.
fn decimal(value: u128, unit: u128) -> String {
    let int = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return int.to_string();
    }
    let width = unit.ilog10() as usize;
    let frac = format!("{frac:0width$}");
    format!("{int}.{}", frac.trim_end_matches('0'))
}

/// Picks the largest unit not above `value` (or the smallest unit for zero).
fn best_unit<'a>(value: u128, units: &[(&'a str, u128)]) -> (&'a str, u128) {
    // Tables for display are ordered from largest to smallest.
    units
        .iter()
        .copied()
        .find(|&(_, m)| value >= m)
        .or_else(|| units.last().copied())
        .unwrap_or(("", 1))
}

/// Implements `Serialize`/`Deserialize` (as the Display/FromStr string) and a string
/// `JsonSchema` with a pattern for a unit type.
macro_rules! string_unit {
    ($ty:ty, $name:literal, $pattern:expr, $description:literal) => {
        string_unit!(@impl $ty, $name, $description, json_schema!({
            "type": "string",
            "pattern": $pattern,
            "description": $description,
        }));
    };
    // With a CEL rule for the API server, for a bound a pattern cannot express.
    ($ty:ty, $name:literal, $pattern:expr, $description:literal, $rule:expr, $message:expr) => {
        string_unit!(@impl $ty, $name, $description, json_schema!({
            "type": "string",
            "pattern": $pattern,
            // Bounds the cost the API server estimates for the rule.
            "maxLength": 64,
            "description": $description,
            "x-kubernetes-validations": [{ "rule": $rule, "message": $message }],
        }));
    };
    (@impl $ty:ty, $name:literal, $description:literal, $schema:expr) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct V;
                impl de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str($description)
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$ty, E> {
                        s.parse().map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(V)
            }
        }

        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

/// Like `string_unit!`, but also accepts plain YAML numbers (`cpu: 2`, `memory: 1048576`)
/// the way Kubernetes quantities do; the schema is int-or-string for the same reason.
macro_rules! int_or_string_unit {
    ($ty:ty, $name:literal, $pattern:expr, $description:literal) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct V;
                impl de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str($description)
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$ty, E> {
                        s.parse().map_err(E::custom)
                    }
                    fn visit_u64<E: de::Error>(self, n: u64) -> Result<$ty, E> {
                        self.visit_str(&n.to_string())
                    }
                    fn visit_i64<E: de::Error>(self, n: i64) -> Result<$ty, E> {
                        self.visit_str(&n.to_string())
                    }
                    fn visit_f64<E: de::Error>(self, n: f64) -> Result<$ty, E> {
                        // f64's Display is the shortest exact round trip, e.g. 0.5 -> "0.5".
                        self.visit_str(&n.to_string())
                    }
                }
                deserializer.deserialize_any(V)
            }
        }

        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "x-kubernetes-int-or-string": true,
                    "pattern": $pattern,
                    "description": $description,
                })
            }
        }
    };
}

// ---------------------------------------------------------------------------------------
// Rate

/// A data rate in bits per second, written `100Mbit`, `1.5Gbps`, `500kbit`, `800bit`.
///
/// Units are case-insensitive (tc writes `mbit`); `bps` means bits, never bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rate(u64);

impl Rate {
    /// 10 Tbit/s: anything faster is a typo, not an emulated link.
    pub const MAX_BPS: u64 = 10_000_000_000_000;

    pub const fn from_bps(bps: u64) -> Self {
        Rate(bps)
    }

    pub const fn bps(self) -> u64 {
        self.0
    }
}

const RATE_PREFIXES: &[(&str, u128)] = &[
    ("", 1),
    ("k", 1_000),
    ("m", 1_000_000),
    ("g", 1_000_000_000),
    ("t", 1_000_000_000_000),
    ("ki", 1 << 10),
    ("mi", 1 << 20),
    ("gi", 1 << 30),
    ("ti", 1 << 40),
];
const RATE_EXPECTED: &str =
    "bit, kbit, Mbit, Gbit, Tbit (or bps, kbps, Mbps, Gbps, Tbps; Kibit, Mibit, Gibit, Tibit)";
const RATE_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?([kKmMgGtT][iI]?)?([bB][iI][tT]|b[pP][sS])$";
/// CEL for the bound the pattern cannot express, `Rate::MAX_BPS`. Doubles are
/// exact enough here: only values within 1 part in 2^52 of the bound differ.
const RATE_MAX_RULE: &str = "double(self.find('^[0-9]+([.][0-9]+)?')) * (self.lowerAscii().matches('ti(bit|bps)$') ? 1099511627776.0 : self.lowerAscii().matches('gi(bit|bps)$') ? 1073741824.0 : self.lowerAscii().matches('mi(bit|bps)$') ? 1048576.0 : self.lowerAscii().matches('ki(bit|bps)$') ? 1024.0 : self.lowerAscii().matches('t(bit|bps)$') ? 1e12 : self.lowerAscii().matches('g(bit|bps)$') ? 1e9 : self.lowerAscii().matches('m(bit|bps)$') ? 1e6 : self.lowerAscii().matches('k(bit|bps)$') ? 1e3 : 1.0) <= 1e13";

impl FromStr for Rate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "rate";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "100Mbit")?;
        if n.unit.is_empty() {
            return Err(fail(Problem::MissingUnit { example: "100Mbit" }));
        }
        // "MBps" conventionally means megabytes; refuse rather than guess.
        let unit = n.unit.as_bytes();
        if unit.len() >= 3
            && unit[unit.len() - 3] == b'B'
            && unit[unit.len() - 2..].eq_ignore_ascii_case(b"ps")
        {
            return Err(fail(Problem::BytesPerSecond {
                unit: n.unit.to_owned(),
            }));
        }
        let lower = n.unit.to_ascii_lowercase();
        let prefix = lower
            .strip_suffix("bit")
            .or_else(|| lower.strip_suffix("bps"));
        let multiplier = prefix
            .and_then(|p| lookup(RATE_PREFIXES, p))
            .ok_or_else(|| {
                fail(Problem::UnknownUnit {
                    unit: n.unit.to_owned(),
                    expected: RATE_EXPECTED,
                })
            })?;
        let bps = n
            .times(multiplier, "bits per second", "10Tbit")
            .map_err(fail)?;
        if bps > u128::from(Rate::MAX_BPS) {
            return Err(fail(Problem::TooLarge { max: "10Tbit" }));
        }
        // The bound check above guarantees the value fits.
        Ok(Rate(u64::try_from(bps).unwrap_or(Rate::MAX_BPS)))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: &[(&str, u128)] = &[
            ("Tbit", 1_000_000_000_000),
            ("Gbit", 1_000_000_000),
            ("Mbit", 1_000_000),
            ("kbit", 1_000),
            ("bit", 1),
        ];
        let v = u128::from(self.0);
        let (name, unit) = best_unit(v, UNITS);
        write!(f, "{}{name}", decimal(v, unit))
    }
}

string_unit!(
    Rate,
    "Rate",
    RATE_PATTERN,
    "a rate in bits per second, e.g. 100Mbit, 1.5Gbps, 500kbit",
    RATE_MAX_RULE,
    "must be at most 10Tbit"
);

// ---------------------------------------------------------------------------------------
// Duration

/// A time span written `10ms`, `1.5s`, `250us`, `0ms` (units: ns, us/µs, ms, s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

impl Duration {
    pub const fn from_std(d: std::time::Duration) -> Self {
        Duration(d)
    }

    pub const fn as_std(self) -> std::time::Duration {
        self.0
    }
}

const DURATION_UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
];
const DURATION_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(ns|us|µs|ms|s)$";

impl FromStr for Duration {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "duration";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "10ms")?;
        if n.unit.is_empty() {
            return Err(fail(Problem::MissingUnit { example: "10ms" }));
        }
        // Case matters here: `Ms` or `MS` would read as mega-seconds to some.
        let multiplier = DURATION_UNITS
            .iter()
            .find(|(name, _)| *name == n.unit)
            .map(|&(_, m)| m)
            .ok_or_else(|| {
                fail(Problem::UnknownUnit {
                    unit: n.unit.to_owned(),
                    expected: "ns, us, ms or s",
                })
            })?;
        let nanos = n
            .times(multiplier, "nanoseconds", "584 years")
            .map_err(fail)?;
        let nanos =
            u64::try_from(nanos).map_err(|_| fail(Problem::TooLarge { max: "584 years" }))?;
        Ok(Duration(std::time::Duration::from_nanos(nanos)))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: &[(&str, u128)] = &[
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ];
        let v = self.0.as_nanos();
        if v == 0 {
            return f.write_str("0s");
        }
        let (name, unit) = best_unit(v, UNITS);
        write!(f, "{}{name}", decimal(v, unit))
    }
}

string_unit!(
    Duration,
    "Duration",
    DURATION_PATTERN,
    "a duration, e.g. 10ms, 1.5s, 250us"
);

// ---------------------------------------------------------------------------------------
// Percent

/// A percentage written `0.5%`, stored in parts per million (so `0.0001%` is the finest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Percent(u32);

impl Percent {
    pub const MAX_PPM: u32 = 1_000_000;

    /// `None` above 100%.
    pub const fn from_ppm(ppm: u32) -> Option<Self> {
        if ppm > Self::MAX_PPM {
            None
        } else {
            Some(Percent(ppm))
        }
    }

    pub const fn ppm(self) -> u32 {
        self.0
    }
}

/// At most 100%, with at most four significant decimals (parts per million),
/// as `FromStr` accepts.
const PERCENT_PATTERN: &str = r"^0*(100(\.0+)?|[0-9]{1,2}(\.[0-9]{1,4}0*)?)%$";

impl FromStr for Percent {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "percentage";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "0.5%")?;
        match n.unit {
            "%" => {}
            // A bare 0.5 could mean 50% or 0.5%; make the user say which.
            "" => return Err(fail(Problem::MissingUnit { example: "0.5%" })),
            other => {
                return Err(fail(Problem::UnknownUnit {
                    unit: other.to_owned(),
                    expected: "%",
                }));
            }
        }
        let ppm = n
            .times(10_000, "parts per million (at most 4 decimals)", "100%")
            .map_err(fail)?;
        if ppm > u128::from(Percent::MAX_PPM) {
            return Err(fail(Problem::TooLarge { max: "100%" }));
        }
        Ok(Percent(u32::try_from(ppm).unwrap_or(Percent::MAX_PPM)))
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", decimal(u128::from(self.0), 10_000))
    }
}

string_unit!(
    Percent,
    "Percent",
    PERCENT_PATTERN,
    "a percentage, e.g. 0.5%"
);

// ---------------------------------------------------------------------------------------
// Fraction

/// A plain decimal between 0 and 1, e.g. `0.002` (RED's averaging weight), stored in
/// millionths so it is exact. YAML may write it as a number or as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fraction(u32);

impl Fraction {
    pub const ONE_PPM: u32 = 1_000_000;

    /// `None` above 1.
    pub const fn from_ppm(ppm: u32) -> Option<Self> {
        if ppm > Self::ONE_PPM {
            None
        } else {
            Some(Fraction(ppm))
        }
    }

    pub const fn ppm(self) -> u32 {
        self.0
    }
}

impl FromStr for Fraction {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "fraction";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "0.002")?;
        if !n.unit.is_empty() {
            return Err(fail(Problem::UnknownUnit {
                unit: n.unit.to_owned(),
                expected: "none: a plain decimal such as 0.002",
            }));
        }
        let ppm = n
            .times(u128::from(Self::ONE_PPM), "millionths", "1")
            .map_err(fail)?;
        if ppm > u128::from(Self::ONE_PPM) {
            return Err(fail(Problem::TooLarge { max: "1" }));
        }
        Ok(Fraction(u32::try_from(ppm).unwrap_or(Self::ONE_PPM)))
    }
}

impl fmt::Display for Fraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&decimal(u128::from(self.0), u128::from(Self::ONE_PPM)))
    }
}

impl Serialize for Fraction {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A number, because that is what the CRD schema declares. Six decimals survive
        // f64 exactly: its shortest representation gives the same digits back.
        serializer.serialize_f64(f64::from(self.0) / f64::from(Self::ONE_PPM))
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Fraction;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a decimal between 0 and 1, e.g. 0.002")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Fraction, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Fraction, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Fraction, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Fraction, E> {
                // f64's Display is the shortest exact round trip and never uses an
                // exponent: 0.002 -> "0.002", 1e-7 -> "0.0000001" (then too precise).
                self.visit_str(&n.to_string())
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl JsonSchema for Fraction {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Fraction".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // A structural CRD schema cannot say "number or string", so the API server
        // takes the number form; local mode also accepts the string form.
        json_schema!({
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "a decimal between 0 and 1, e.g. 0.002",
        })
    }
}

// ---------------------------------------------------------------------------------------
// Size

/// An amount of data: bytes (`100MB` decimal, `1MiB`/`64Mi` binary, bare number = bytes)
/// or packets (`1000pkt`, used for queue limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Size {
    Packets(u64),
    Bytes(u64),
}

impl Size {
    pub const fn bytes(self) -> Option<u64> {
        match self {
            Size::Bytes(b) => Some(b),
            Size::Packets(_) => None,
        }
    }

    pub const fn packets(self) -> Option<u64> {
        match self {
            Size::Packets(p) => Some(p),
            Size::Bytes(_) => None,
        }
    }
}

const SIZE_PREFIXES: &[(&str, u128)] = &[
    ("", 1),
    ("k", 1_000),
    ("m", 1_000_000),
    ("g", 1_000_000_000),
    ("t", 1_000_000_000_000),
    ("ki", 1 << 10),
    ("mi", 1 << 20),
    ("gi", 1 << 30),
    ("ti", 1 << 40),
];
const SIZE_EXPECTED: &str = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB (the B is optional) or pkt";
const SIZE_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?([kKmMgGtT][iI]?[bB]?|[bB]|[pP][kK][tT][sS]?)?$";

impl FromStr for Size {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "size";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "100MB")?;
        let lower = n.unit.to_ascii_lowercase();
        let too_large = || fail(Problem::TooLarge { max: "2^64-1" });
        if lower == "pkt" || lower == "pkts" {
            let p = n.times(1, "packets", "2^64-1").map_err(fail)?;
            return u64::try_from(p).map(Size::Packets).map_err(|_| too_large());
        }
        let prefix = lower.strip_suffix('b').unwrap_or(&lower);
        let multiplier = lookup(SIZE_PREFIXES, prefix).ok_or_else(|| {
            fail(Problem::UnknownUnit {
                unit: n.unit.to_owned(),
                expected: SIZE_EXPECTED,
            })
        })?;
        let b = n.times(multiplier, "bytes", "2^64-1").map_err(fail)?;
        u64::try_from(b).map(Size::Bytes).map_err(|_| too_large())
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const BINARY: &[(&str, u128)] = &[
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        const DECIMAL: &[(&str, u128)] = &[
            ("TB", 1_000_000_000_000),
            ("GB", 1_000_000_000),
            ("MB", 1_000_000),
            ("kB", 1_000),
            ("B", 1),
        ];
        match *self {
            Size::Packets(p) => write!(f, "{p}pkt"),
            Size::Bytes(b) => {
                let v = u128::from(b);
                // Binary only when exact (64MiB); otherwise decimal, which is always exact.
                if let Some((name, unit)) = BINARY.iter().find(|&&(_, m)| v >= m && v % m == 0) {
                    return write!(f, "{}{name}", v / unit);
                }
                let (name, unit) = best_unit(v, DECIMAL);
                write!(f, "{}{name}", decimal(v, unit))
            }
        }
    }
}

int_or_string_unit!(
    Size,
    "Size",
    SIZE_PATTERN,
    "an amount of data, e.g. 100MB, 1MiB, 64Mi, or packets, e.g. 1000pkt"
);

// ---------------------------------------------------------------------------------------
// Cpu

/// CPU in millicores, written like Kubernetes: `500m`, `2`, `0.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cpu(u32);

impl Cpu {
    pub const fn from_millis(millis: u32) -> Self {
        Cpu(millis)
    }

    pub const fn millis(self) -> u32 {
        self.0
    }
}

const CPU_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?m?$";

impl FromStr for Cpu {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KIND: &str = "cpu";
        let fail = |problem| UnitError {
            kind: KIND,
            input: s.to_owned(),
            problem,
        };
        let n = split_number(KIND, s, "500m")?;
        let multiplier = match n.unit {
            "m" => 1,
            "" => 1_000,
            other => {
                return Err(fail(Problem::UnknownUnit {
                    unit: other.to_owned(),
                    expected: "m (millicores) or none (cores)",
                }));
            }
        };
        let millis = n
            .times(multiplier, "millicores", "4294967295m")
            .map_err(fail)?;
        u32::try_from(millis)
            .map(Cpu)
            .map_err(|_| fail(Problem::TooLarge { max: "4294967295m" }))
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1_000) {
            write!(f, "{}", self.0 / 1_000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

int_or_string_unit!(
    Cpu,
    "Cpu",
    CPU_PATTERN,
    "CPU in cores or millicores, e.g. 500m, 2, 0.5"
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rate(s: &str) -> u64 {
        s.parse::<Rate>()
            .map(Rate::bps)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err<T: FromStr<Err = UnitError> + fmt::Debug>(s: &str) -> String {
        match s.parse::<T>() {
            Ok(v) => panic!("{s:?} parsed as {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn rates() {
        assert_eq!(rate("100Mbit"), 100_000_000);
        assert_eq!(rate("1Gbit"), 1_000_000_000);
        assert_eq!(rate("1.5Gbps"), 1_500_000_000);
        assert_eq!(rate("500kbit"), 500_000);
        assert_eq!(rate("10Mbps"), 10_000_000);
        assert_eq!(rate("800bit"), 800);
        assert_eq!(rate("100mbit"), 100_000_000);
        assert_eq!(rate("2GBIT"), 2_000_000_000);
        assert_eq!(rate("1Mibit"), 1 << 20);
        assert_eq!(rate("10Tbit"), Rate::MAX_BPS);
        assert_eq!(rate("0bit"), 0);
    }

    #[test]
    fn rate_errors_say_what_is_wrong() {
        assert_eq!(
            err::<Rate>("-5Mbit"),
            "invalid rate \"-5Mbit\": negative values are not allowed"
        );
        assert_eq!(
            err::<Rate>("100"),
            "invalid rate \"100\": a unit is required (e.g. 100Mbit)"
        );
        assert!(err::<Rate>("100Mbt").contains("unknown unit \"Mbt\""));
        assert!(err::<Rate>("11Tbit").contains("exceeds the maximum of 10Tbit"));
        assert!(err::<Rate>("10MBps").contains("bytes per second"));
        assert!(err::<Rate>("1.0001bit").contains("not a whole number of bits per second"));
        assert!(err::<Rate>("fast").contains("must start with a number"));
        assert!(err::<Rate>("").contains("empty"));
        assert!(err::<Rate>("1.Mbit").contains("must start with a number"));
        assert!(err::<Rate>("1e6bit").contains("unknown unit"));
        assert!(err::<Rate>("99999999999999999999999999999999999999999Gbit").contains("exceeds"));
    }

    #[test]
    fn durations() {
        let d = |s: &str| {
            s.parse::<Duration>()
                .map(Duration::as_std)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        assert_eq!(d("10ms"), std::time::Duration::from_millis(10));
        assert_eq!(d("1.5s"), std::time::Duration::from_millis(1500));
        assert_eq!(d("250us"), std::time::Duration::from_micros(250));
        assert_eq!(d("250µs"), std::time::Duration::from_micros(250));
        assert_eq!(d("0ms"), std::time::Duration::ZERO);
        assert_eq!(d("7ns"), std::time::Duration::from_nanos(7));
        assert!(err::<Duration>("10").contains("a unit is required"));
        assert!(err::<Duration>("10MS").contains("unknown unit \"MS\""));
        assert!(err::<Duration>("-1ms").contains("negative"));
        assert!(err::<Duration>("1.5ns").contains("not a whole number of nanoseconds"));
    }

    #[test]
    fn percents() {
        let p = |s: &str| {
            s.parse::<Percent>()
                .map(Percent::ppm)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        assert_eq!(p("0.5%"), 5_000);
        assert_eq!(p("100%"), 1_000_000);
        assert_eq!(p("0%"), 0);
        assert_eq!(p("0.0001%"), 1);
        assert!(err::<Percent>("100.5%").contains("exceeds the maximum of 100%"));
        assert!(err::<Percent>("0.5").contains("a unit is required (e.g. 0.5%)"));
        assert!(err::<Percent>("0.00001%").contains("not a whole number of parts per million"));
        assert!(err::<Percent>("-1%").contains("negative"));
        assert_eq!(Percent::from_ppm(1_000_001), None);
    }

    #[test]
    fn fractions() {
        let f = |s: &str| {
            s.parse::<Fraction>()
                .map(Fraction::ppm)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        assert_eq!(f("0.002"), 2_000);
        assert_eq!(f("1"), 1_000_000);
        assert_eq!(f("0"), 0);
        assert_eq!(f("0.000001"), 1);
        assert!(err::<Fraction>("1.5").contains("exceeds the maximum of 1"));
        assert!(err::<Fraction>("0.0000001").contains("not a whole number of millionths"));
        assert!(err::<Fraction>("0.5%").contains("unknown unit \"%\""));
        assert!(err::<Fraction>("-0.1").contains("negative"));
        let from_yaml = |y: &str| serde_norway::from_str::<Fraction>(y).map(Fraction::ppm);
        assert_eq!(from_yaml("0.002").ok(), Some(2_000), "a YAML number");
        assert_eq!(from_yaml("\"0.002\"").ok(), Some(2_000), "a string");
        assert_eq!(from_yaml("1").ok(), Some(1_000_000), "an integer");
        assert!(from_yaml("1.0e-7").is_err());
        assert_eq!(Fraction(2_000).to_string(), "0.002");
        assert_eq!(
            serde_json::to_value(Fraction(2_000)).ok(),
            Some(serde_json::json!(0.002))
        );
    }

    #[test]
    fn sizes() {
        let s = |s: &str| s.parse::<Size>().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(s("100MB"), Size::Bytes(100_000_000));
        assert_eq!(s("1MiB"), Size::Bytes(1 << 20));
        assert_eq!(s("64Mi"), Size::Bytes(64 << 20));
        assert_eq!(s("1000pkt"), Size::Packets(1000));
        assert_eq!(s("1000"), Size::Bytes(1000));
        assert_eq!(s("1.5kB"), Size::Bytes(1500));
        assert_eq!(s("2G"), Size::Bytes(2_000_000_000));
        assert_eq!(s("10B"), Size::Bytes(10));
        assert!(err::<Size>("1.5pkt").contains("not a whole number of packets"));
        assert!(err::<Size>("10XB").contains("unknown unit \"XB\""));
        assert!(err::<Size>("0.5B").contains("not a whole number of bytes"));
        assert!(err::<Size>("100000000TB").contains("exceeds"));
    }

    #[test]
    fn cpus() {
        let c = |s: &str| {
            s.parse::<Cpu>()
                .map(Cpu::millis)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        assert_eq!(c("500m"), 500);
        assert_eq!(c("2"), 2000);
        assert_eq!(c("0.5"), 500);
        assert!(err::<Cpu>("0.0005").contains("not a whole number of millicores"));
        assert!(err::<Cpu>("2cores").contains("unknown unit \"cores\""));
    }

    #[test]
    fn display_is_readable() {
        assert_eq!(Rate::from_bps(1_500_000_000).to_string(), "1.5Gbit");
        assert_eq!(Rate::from_bps(100_000_000).to_string(), "100Mbit");
        assert_eq!(Rate::from_bps(0).to_string(), "0bit");
        assert_eq!(
            Duration::from_std(std::time::Duration::from_millis(1500)).to_string(),
            "1.5s"
        );
        assert_eq!(
            Duration::from_std(std::time::Duration::ZERO).to_string(),
            "0s"
        );
        assert_eq!(
            Duration::from_std(std::time::Duration::from_micros(250)).to_string(),
            "250us"
        );
        assert_eq!(Percent(5_000).to_string(), "0.5%");
        assert_eq!(Size::Bytes(64 << 20).to_string(), "64MiB");
        assert_eq!(Size::Bytes(100_000_000).to_string(), "100MB");
        assert_eq!(Size::Bytes(0).to_string(), "0B");
        assert_eq!(Size::Packets(1000).to_string(), "1000pkt");
        assert_eq!(Cpu(500).to_string(), "500m");
        assert_eq!(Cpu(2000).to_string(), "2");
    }

    #[test]
    fn serde_uses_the_string_form() {
        #[derive(Debug, Serialize, Deserialize, PartialEq)]
        struct Doc {
            rate: Rate,
            delay: Duration,
            loss: Percent,
            queue: Size,
            cpu: Cpu,
            memory: Size,
        }
        let yaml =
            "rate: 100Mbit\ndelay: 5ms\nloss: 0.1%\nqueue: 1000pkt\ncpu: 0.5\nmemory: 1048576\n";
        let doc: Doc = serde_norway::from_str(yaml).expect("parses");
        assert_eq!(doc.rate, Rate(100_000_000));
        assert_eq!(doc.cpu, Cpu(500));
        assert_eq!(doc.memory, Size::Bytes(1 << 20));
        let json = serde_json::to_value(&doc).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({"rate": "100Mbit", "delay": "5ms", "loss": "0.1%", "queue": "1000pkt", "cpu": "500m", "memory": "1MiB"})
        );
        let bad = serde_norway::from_str::<Doc>(&yaml.replace("100Mbit", "100Mbt"));
        let msg = bad
            .map(|_| ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("rate: invalid rate \"100Mbt\": unknown unit"),
            "{msg}"
        );
        // Numbers are only accepted where Kubernetes would accept them (int-or-string).
        assert!(serde_norway::from_str::<Doc>(&yaml.replace("5ms", "5")).is_err());
    }

    #[test]
    fn schemas_carry_patterns() {
        let mut generator = SchemaGenerator::default();
        let rate = Rate::json_schema(&mut generator);
        assert_eq!(rate.get("type"), Some(&serde_json::json!("string")));
        assert_eq!(rate.get("pattern"), Some(&serde_json::json!(RATE_PATTERN)));
        let cpu = Cpu::json_schema(&mut generator);
        assert_eq!(
            cpu.get("x-kubernetes-int-or-string"),
            Some(&serde_json::json!(true))
        );
    }

    fn pattern(p: &str) -> regex::Regex {
        regex::Regex::new(p).expect("the CRD pattern compiles")
    }

    proptest! {
        // What the API server admits by pattern is what the parser accepts, so
        // no stored object fails to decode (which would stop the watch of its
        // kind). Rates also have a CEL bound (RATE_MAX_RULE) and may be refused
        // for a fraction of a bit, which no pattern expresses.
        #[test]
        fn rate_pattern_matches_the_parser(s in "[0-9]{1,15}(\\.[0-9]{1,14})?([kKmMgGtTx][iI]?)?([bB][iI][tT]|[bB][pP][sS]|Bit|B)") {
            let admitted = pattern(RATE_PATTERN).is_match(&s);
            match s.parse::<Rate>() {
                Ok(_) => prop_assert!(admitted, "{s} parses but the pattern refuses it"),
                Err(e) => prop_assert!(
                    !admitted || matches!(e.problem, Problem::TooLarge { .. } | Problem::Fractional { .. }),
                    "{s} is admitted but refused: {e}"
                ),
            }
        }

        #[test]
        fn percent_pattern_matches_the_parser(s in "0{0,2}[0-9]{1,3}(\\.[0-9]{0,7})?%?") {
            prop_assert_eq!(pattern(PERCENT_PATTERN).is_match(&s), s.parse::<Percent>().is_ok(), "{}", s);
        }

        #[test]
        fn rate_round_trips(bps in 0..=Rate::MAX_BPS) {
            let r = Rate::from_bps(bps);
            prop_assert_eq!(r.to_string().parse::<Rate>(), Ok(r));
        }

        #[test]
        fn duration_round_trips(nanos: u64) {
            let d = Duration::from_std(std::time::Duration::from_nanos(nanos));
            prop_assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
        }

        #[test]
        fn percent_round_trips(ppm in 0..=Percent::MAX_PPM) {
            let p = Percent(ppm);
            prop_assert_eq!(p.to_string().parse::<Percent>(), Ok(p));
        }

        #[test]
        fn size_round_trips(n: u64, packets: bool) {
            let s = if packets { Size::Packets(n) } else { Size::Bytes(n) };
            prop_assert_eq!(s.to_string().parse::<Size>(), Ok(s));
        }

        #[test]
        fn fraction_round_trips_through_text_and_json(ppm in 0..=Fraction::ONE_PPM) {
            let f = Fraction(ppm);
            prop_assert_eq!(f.to_string().parse::<Fraction>(), Ok(f));
            let json = serde_json::to_string(&f).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(serde_json::from_str::<Fraction>(&json).ok(), Some(f));
        }

        #[test]
        fn cpu_round_trips(millis: u32) {
            let c = Cpu(millis);
            prop_assert_eq!(c.to_string().parse::<Cpu>(), Ok(c));
        }

        #[test]
        fn decimal_rates_are_exact(int in 0u64..10_000, frac in 0u64..1_000) {
            let s = format!("{int}.{frac:03}Mbit");
            prop_assert_eq!(rate(&s), int * 1_000_000 + frac * 1_000);
        }

        #[test]
        fn parsers_never_panic(s in "\\PC{0,20}") {
            let _ = s.parse::<Rate>();
            let _ = s.parse::<Duration>();
            let _ = s.parse::<Percent>();
            let _ = s.parse::<Size>();
            let _ = s.parse::<Cpu>();
            let _ = s.parse::<Fraction>();
        }
    }
}
