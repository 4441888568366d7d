//! Registered schemes: schedulers and AQMs that YAML names by `scheme: {name,
//! settings}`, with no change to the API, the planner, the proto or the hub.
//!
//! Adding one is a file in this folder (the scheme, its settings and its tests)
//! and its line in [`SCHEDULERS`] or [`AQMS`]. The framework does the rest: the
//! operator checks a manifest's settings with the scheme's own types and refuses
//! unknown names (also in SQL writes), the hub carries the settings as JSON, and
//! the agent builds the scheme into each link's pipeline.
//!
//! The built-in schemes (fcfs, wrr, drr, priority, taildrop, red, ecn) keep their
//! own typed fields: they predate the registry and the database checks every one of
//! their numbers.

mod pfabric;
mod pie;

use super::{Aqm, Scheduler};
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

/// Every registered scheduler, by name.
pub const SCHEDULERS: &[SchedulerEntry] = &[scheduler::<pfabric::Pfabric>()];

/// Every registered AQM, by name.
pub const AQMS: &[AqmEntry] = &[aqm::<pie::Pie>()];

/// What a scheme may know of the link it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkContext {
    pub mtu: u32,
    /// Bits per second; 0 when the link is not shaped.
    pub rate_bps: u64,
}

/// A scheduler that a link names by `scheduler: {scheme: {name: NAME}}`.
pub trait SchedulerScheme: 'static {
    const NAME: &'static str;
    /// One line for error messages and `nextmini` listings.
    const SUMMARY: &'static str;
    /// Read from the YAML's `settings` (camelCase keys, unknown keys refused).
    type Settings: DeserializeOwned;
    /// True when the scheduler sorts packets into its queues itself
    /// ([`Scheduler::classifier`]); a link may then set no class rules.
    const CLASSIFIES: bool = false;
    /// How many queues the scheduler serves (1 to 64), or why the settings make no
    /// sense beyond their types.
    fn queues(settings: &Self::Settings) -> Result<usize, SettingsError>;
    fn build(settings: &Self::Settings, link: &LinkContext) -> Box<dyn Scheduler>;
}

/// An AQM that a link names by `queue: {aqm: {scheme: {name: NAME}}}`; one is
/// built per queue.
pub trait AqmScheme: 'static {
    const NAME: &'static str;
    const SUMMARY: &'static str;
    type Settings: DeserializeOwned;
    /// Why the settings make no sense beyond their types, if they do not.
    fn check(_settings: &Self::Settings) -> Result<(), SettingsError> {
        Ok(())
    }
    fn build(settings: &Self::Settings, link: &LinkContext) -> Box<dyn Aqm>;
}

/// Why a scheme's settings were refused; `field` is the path inside `settings`
/// (empty for the whole mapping).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}{reason}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
pub struct SettingsError {
    pub field: String,
    pub reason: String,
}

impl SettingsError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> SettingsError {
        SettingsError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Why a named scheme cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchemeError {
    #[error("no {role} scheme is called {name:?}; registered: {known}")]
    Unknown {
        role: &'static str,
        name: String,
        known: String,
    },
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

impl SchemeError {
    /// The field the problem is in, relative to the `scheme` mapping.
    pub fn field(&self) -> String {
        match self {
            SchemeError::Unknown { .. } => "name".to_owned(),
            SchemeError::Settings(e) if e.field.is_empty() => "settings".to_owned(),
            SchemeError::Settings(e) => format!("settings.{}", e.field),
        }
    }

    /// What is wrong, without the field.
    pub fn reason(&self) -> String {
        match self {
            SchemeError::Settings(e) => e.reason.clone(),
            unknown => unknown.to_string(),
        }
    }
}

type BuildScheduler = fn(&Value, &LinkContext) -> Result<Box<dyn Scheduler>, SettingsError>;
type BuildAqm = fn(&Value, &LinkContext) -> Result<Box<dyn Aqm>, SettingsError>;

/// A registered scheduler with its types erased.
pub struct SchedulerEntry {
    pub name: &'static str,
    pub summary: &'static str,
    pub classifies: bool,
    queues: fn(&Value) -> Result<usize, SettingsError>,
    build: BuildScheduler,
}

/// A registered AQM with its types erased.
pub struct AqmEntry {
    pub name: &'static str,
    pub summary: &'static str,
    check: fn(&Value) -> Result<(), SettingsError>,
    build: BuildAqm,
}

const fn scheduler<S: SchedulerScheme>() -> SchedulerEntry {
    SchedulerEntry {
        name: S::NAME,
        summary: S::SUMMARY,
        classifies: S::CLASSIFIES,
        queues: scheduler_queues::<S>,
        build: build_scheduler::<S>,
    }
}

fn scheduler_queues<S: SchedulerScheme>(v: &Value) -> Result<usize, SettingsError> {
    S::queues(&settings::<S::Settings>(v)?)
}

fn build_scheduler<S: SchedulerScheme>(
    v: &Value,
    link: &LinkContext,
) -> Result<Box<dyn Scheduler>, SettingsError> {
    let s = settings::<S::Settings>(v)?;
    S::queues(&s)?;
    Ok(S::build(&s, link))
}

const fn aqm<A: AqmScheme>() -> AqmEntry {
    AqmEntry {
        name: A::NAME,
        summary: A::SUMMARY,
        check: check_aqm::<A>,
        build: build_aqm::<A>,
    }
}

fn check_aqm<A: AqmScheme>(v: &Value) -> Result<(), SettingsError> {
    A::check(&settings::<A::Settings>(v)?)
}

fn build_aqm<A: AqmScheme>(v: &Value, link: &LinkContext) -> Result<Box<dyn Aqm>, SettingsError> {
    let s = settings::<A::Settings>(v)?;
    A::check(&s)?;
    Ok(A::build(&s, link))
}

/// Reads settings, naming the path of the first key that does not fit; a missing
/// `settings` reads as `{}`.
fn settings<T: DeserializeOwned>(v: &Value) -> Result<T, SettingsError> {
    let empty = Value::Object(serde_json::Map::new());
    let v = if v.is_null() { &empty } else { v };
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        SettingsError::new(field, e.into_inner().to_string())
    })
}

fn known(names: impl Iterator<Item = &'static str>) -> String {
    let names: Vec<_> = names.collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The registered scheduler called `name`.
pub fn find_scheduler(name: &str) -> Result<&'static SchedulerEntry, SchemeError> {
    SCHEDULERS
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| SchemeError::Unknown {
            role: "scheduler",
            name: name.to_owned(),
            known: known(SCHEDULERS.iter().map(|e| e.name)),
        })
}

/// The registered AQM called `name`.
pub fn find_aqm(name: &str) -> Result<&'static AqmEntry, SchemeError> {
    AQMS.iter()
        .find(|e| e.name == name)
        .ok_or_else(|| SchemeError::Unknown {
            role: "AQM",
            name: name.to_owned(),
            known: known(AQMS.iter().map(|e| e.name)),
        })
}

impl SchedulerEntry {
    /// How many queues these settings give, once they are checked.
    pub fn queues(&self, settings: &Value) -> Result<usize, SchemeError> {
        let n = (self.queues)(settings)?;
        if !(1..=MAX_SCHEME_QUEUES).contains(&n) {
            return Err(SettingsError::new(
                "",
                format!("give {n} queues; a scheduler serves 1 to {MAX_SCHEME_QUEUES}"),
            )
            .into());
        }
        Ok(n)
    }

    pub fn build(
        &self,
        settings: &Value,
        link: &LinkContext,
    ) -> Result<Box<dyn Scheduler>, SchemeError> {
        Ok((self.build)(settings, link)?)
    }
}

impl AqmEntry {
    pub fn check(&self, settings: &Value) -> Result<(), SchemeError> {
        Ok((self.check)(settings)?)
    }

    pub fn build(&self, settings: &Value, link: &LinkContext) -> Result<Box<dyn Aqm>, SchemeError> {
        Ok((self.build)(settings, link)?)
    }
}

/// Most queues a registered scheduler may serve, as for the built-in ones.
pub const MAX_SCHEME_QUEUES: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_unique_and_dns_safe() {
        let mut names: Vec<_> = SCHEDULERS
            .iter()
            .map(|e| e.name)
            .chain(AQMS.iter().map(|e| e.name))
            .collect();
        for name in &names {
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), before, "two schemes share a name");
    }

    #[test]
    fn an_unknown_name_lists_the_registered_ones() {
        let Err(e) = find_scheduler("fifo") else {
            panic!("found fifo")
        };
        assert_eq!(e.field(), "name");
        assert!(e.reason().contains("registered: pfabric"), "{e}");
        let Err(e) = find_aqm("codel") else {
            panic!("found codel")
        };
        assert!(
            e.reason()
                .contains("no AQM scheme is called \"codel\"; registered: pie"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_setting_is_named_by_its_path() {
        let pfabric = find_scheduler("pfabric").expect("registered");
        let e = pfabric
            .queues(&json!({"flows": [{"port": 5001, "bytes": 1000}, {"port": 70000, "bytes": 1}]}))
            .expect_err("port out of range");
        assert_eq!(e.field(), "settings.flows[1].port", "{e}");
        let e = pfabric
            .queues(&json!({"flows": [], "extra": 1}))
            .expect_err("unknown key");
        assert!(e.reason().contains("unknown field `extra`"), "{e}");
    }
}
