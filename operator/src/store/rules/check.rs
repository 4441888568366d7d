//! The Rust reading of a rule document: the subset of JSON Schema that schemars
//! emits for the plan's types, plus four keywords of ours for what one value cannot
//! show. Migration 0011's `nextmini_json_problem` is the same walk in PL/pgSQL, in
//! the same order, so both name the same key for the same value (a test feeds both
//! random documents and compares them).
//!
//! Our keywords, on an object:
//! - `x-at-most-one: [a, b]`: at most one of the keys is set (not null);
//! - `x-less-than: [a, b]`: the number at path `a` is below the one at `b` (dotted
//!   paths, relative to the object);
//! - `x-thresholds-fit-limit`: a RED `max_packets` or ECN `threshold_packets` does
//!   not exceed the queue's `limit_packets`;
//! - `x-classes-fit-scheduler`: every class names a queue the scheduler has;
//!
//! and on a number, `x-minimum-mtu`: at least the topology's MTU, when known.

use serde_json::{Map, Value};
use std::cmp::Ordering;

/// What a check knows beyond the value itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    /// The topology's MTU, for byte counts that must hold a full packet.
    pub mtu: Option<u64>,
}

/// The first problem of `value` under the document `root`, as
/// `path: what is wrong`, or `None` when the value is valid.
pub fn problem(root: &Value, value: &Value, path: &str, ctx: Context) -> Option<String> {
    Walk { root, ctx }.at(root, value, path)
}

struct Walk<'a> {
    root: &'a Value,
    ctx: Context,
}

impl Walk<'_> {
    fn at(&self, schema: &Value, v: &Value, path: &str) -> Option<String> {
        let s = match schema {
            Value::Bool(true) => return None,
            Value::Bool(false) => return Some(format!("{path}: is not allowed")),
            Value::Object(s) => s,
            _ => return Some(format!("{path}: the rule document is malformed")),
        };
        if let Some(reference) = s.get("$ref").and_then(Value::as_str) {
            let Some(target) = self.resolve(reference) else {
                return Some(format!("{path}: the rule document lacks {reference}"));
            };
            if let Some(p) = self.at(target, v, path) {
                return Some(p);
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = s.get(key).and_then(Value::as_array)
                && let Some(p) = self.choice(branches, v, path)
            {
                return Some(p);
            }
        }
        if let Some(types) = s.get("type")
            && !type_matches(types, v)
        {
            return Some(format!(
                "{path}: must be {}, got {}",
                type_names(types),
                shown(v)
            ));
        }
        if let Some(allowed) = s.get("enum").and_then(Value::as_array)
            && !allowed.iter().any(|a| same(a, v))
        {
            return Some(format!(
                "{path}: must be one of {}, got {}",
                listed(allowed),
                shown(v)
            ));
        }
        if let Some(c) = s.get("const")
            && !same(c, v)
        {
            return Some(format!("{path}: must be {}, got {}", shown(c), shown(v)));
        }
        match v {
            Value::Number(_) => self.number(s, v, path),
            Value::Object(o) => self.object(s, o, path),
            Value::Array(items) => self.array(s, items, path),
            _ => None,
        }
    }

    fn resolve(&self, reference: &str) -> Option<&Value> {
        self.root.pointer(reference.strip_prefix('#')?)
    }

    /// `anyOf`/`oneOf` (serde's enums: their branches never overlap): valid when a
    /// branch takes the value; otherwise the problem of the branch the value meant.
    fn choice(&self, branches: &[Value], v: &Value, path: &str) -> Option<String> {
        if branches.iter().any(|b| self.at(b, v, path).is_none()) {
            return None;
        }
        let live: Vec<&Value> = branches
            .iter()
            .filter(|b| v.is_null() || !is_null_type(b))
            .collect();
        if let [only] = live.as_slice() {
            return self.at(only, v, path);
        }
        if let Some(o) = v.as_object()
            && o.len() == 1
            && let Some(key) = o.keys().next()
            && let Some(meant) = live.iter().find(|b| single_required(b) == Some(key))
        {
            return self.at(meant, v, path);
        }
        let names: Vec<Value> = live.iter().flat_map(|b| branch_names(b)).collect();
        Some(format!(
            "{path}: must be one of {}, got {}",
            listed(&names),
            shown(v)
        ))
    }

    fn number(&self, s: &Map<String, Value>, v: &Value, path: &str) -> Option<String> {
        let (format_min, format_max) = s
            .get("format")
            .and_then(Value::as_str)
            .map_or((None, None), format_bounds);
        let min = tighter(
            s.get("minimum").and_then(number),
            format_min,
            Ordering::Greater,
        );
        let max = tighter(
            s.get("maximum").and_then(number),
            format_max,
            Ordering::Less,
        );
        let n = number(v)?;
        if let Some(min) = min.filter(|m| n.cmp(m) == Ordering::Less) {
            return Some(format!("{path}: must be at least {min}, got {n}"));
        }
        if let Some(max) = max.filter(|m| n.cmp(m) == Ordering::Greater) {
            return Some(format!("{path}: must be at most {max}, got {n}"));
        }
        if s.get("x-minimum-mtu") == Some(&Value::Bool(true))
            && let Some(mtu) = self.ctx.mtu
            && n.cmp(&Num::Int(i128::from(mtu))) == Ordering::Less
        {
            return Some(format!(
                "{path}: must be at least the MTU ({mtu} bytes), got {n}: it could never pass a full-size packet"
            ));
        }
        None
    }

    fn object(&self, s: &Map<String, Value>, o: &Map<String, Value>, path: &str) -> Option<String> {
        for key in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !o.contains_key(key) {
                return Some(format!("{path}: missing key {key}"));
            }
        }
        let empty = Map::new();
        let properties = s
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        if s.get("additionalProperties") == Some(&Value::Bool(false)) {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            if let Some(unknown) = keys.into_iter().find(|k| !properties.contains_key(*k)) {
                let mut known: Vec<&str> = properties.keys().map(String::as_str).collect();
                known.sort_unstable();
                return Some(format!(
                    "{path}: unknown key {unknown} (known keys: {})",
                    known.join(", ")
                ));
            }
        }
        let mut declared: Vec<(&String, &Value)> = properties.iter().collect();
        declared.sort_by(|a, b| a.0.cmp(b.0));
        for (key, sub) in declared {
            if let Some(value) = o.get(key)
                && let Some(p) = self.at(sub, value, &format!("{path}.{key}"))
            {
                return Some(p);
            }
        }
        let object = Value::Object(o.clone());
        if let Some(keys) = s.get("x-at-most-one").and_then(Value::as_array) {
            let set: Vec<&str> = keys
                .iter()
                .filter_map(Value::as_str)
                .filter(|k| o.get(*k).is_some_and(|v| !v.is_null()))
                .collect();
            if set.len() > 1 {
                return Some(format!(
                    "{path}: set at most one of {}, got {}",
                    listed(keys),
                    set.join(" and ")
                ));
            }
        }
        if let Some([a, b]) = s
            .get("x-less-than")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            && let (Some(a), Some(b)) = (a.as_str(), b.as_str())
            && let (Some(av), Some(bv)) = (dotted(&object, a), dotted(&object, b))
            && av.cmp(&bv) != Ordering::Less
        {
            return Some(format!(
                "{path}.{a}: must be less than {b} ({bv}), got {av}"
            ));
        }
        if s.get("x-thresholds-fit-limit") == Some(&Value::Bool(true))
            && let Some(limit) = dotted(&object, "limit_packets")
        {
            for field in ["aqm.red.max_packets", "aqm.ecn.threshold_packets"] {
                if let Some(t) = dotted(&object, field)
                    && t.cmp(&limit) == Ordering::Greater
                {
                    return Some(format!(
                        "{path}.{field}: must not exceed limit_packets ({limit}), got {t}: the queue could never get that long"
                    ));
                }
            }
        }
        if s.get("x-classes-fit-scheduler") == Some(&Value::Bool(true)) {
            let queues = queue_count(o.get("scheduler"));
            let classes = o.get("classes").and_then(Value::as_array);
            for (i, class) in classes.into_iter().flatten().enumerate() {
                if let Some(q) = dotted(class, "queue")
                    && q.cmp(&Num::Int(queues)) != Ordering::Less
                {
                    return Some(format!(
                        "{path}.classes[{i}].queue: queue {q} does not exist: the scheduler has {queues} queue(s), 0 to {}",
                        queues - 1
                    ));
                }
            }
        }
        None
    }

    fn array(&self, s: &Map<String, Value>, items: &[Value], path: &str) -> Option<String> {
        let len = items.len();
        if let Some(min) = s.get("minItems").and_then(Value::as_u64)
            && (len as u64) < min
        {
            return Some(format!(
                "{path}: must list at least {min} item(s), got {len}"
            ));
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
            && (len as u64) > max
        {
            return Some(format!(
                "{path}: must list at most {max} item(s), got {len}"
            ));
        }
        let prefix = s
            .get("prefixItems")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for (i, item) in items.iter().enumerate() {
            let sub = match prefix.get(i) {
                Some(sub) => sub,
                None => match s.get("items") {
                    Some(sub) => sub,
                    None => continue,
                },
            };
            if let Some(p) = self.at(sub, item, &format!("{path}[{i}]")) {
                return Some(p);
            }
        }
        None
    }
}

/// What the class check assumes of a registered scheme: the most queues any
/// scheduler may have (migration 0013 says the same).
const SCHEME_QUEUES_BOUND: i128 = nextmini_agent::sched::schemes::MAX_SCHEME_QUEUES as i128;

/// How many queues a stored scheduler serves (as `SchedulerKind::queues`).
fn queue_count(scheduler: Option<&Value>) -> i128 {
    let Some(Value::Object(o)) = scheduler else {
        return 1; // fcfs, or unset (the default, fcfs)
    };
    let len = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, |a| a.len() as i128);
    if let Some(w) = o.get("wrr") {
        len(w.get("weights"))
    } else if let Some(d) = o.get("drr") {
        len(d.get("quantum_bytes"))
    } else if let Some(p) = o.get("priority") {
        match p.get("bands").and_then(number) {
            Some(Num::Int(n)) => n,
            _ => 0,
        }
    } else if o.contains_key("scheme") {
        // A registered scheme's queues follow from its settings, which only the
        // scheme reads (the hub does, before the agent gets them); here the bound
        // every scheduler shares.
        SCHEME_QUEUES_BOUND
    } else {
        1
    }
}

/// A JSON number, exactly when it is an integer.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn cmp(&self, other: &Num) -> Ordering {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(b),
            _ => self
                .as_f64()
                .partial_cmp(&other.as_f64())
                .unwrap_or(Ordering::Equal),
        }
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

fn number(v: &Value) -> Option<Num> {
    let n = v.as_number()?;
    if let Some(u) = n.as_u64() {
        Some(Num::Int(i128::from(u)))
    } else if let Some(i) = n.as_i64() {
        Some(Num::Int(i128::from(i)))
    } else {
        n.as_f64().map(Num::Float)
    }
}

/// The number at a dotted path inside `v`.
fn dotted(v: &Value, path: &str) -> Option<Num> {
    path.split('.')
        .try_fold(v, |v, key| v.get(key))
        .and_then(number)
}

/// The bound of the two that constrains more (`keep`: the ordering the kept one has
/// against the other).
fn tighter(a: Option<Num>, b: Option<Num>, keep: Ordering) -> Option<Num> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if a.cmp(&b) == keep { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The range schemars' integer formats stand for.
fn format_bounds(format: &str) -> (Option<Num>, Option<Num>) {
    let unsigned = |bits: u32| (Some(Num::Int(0)), Some(Num::Int((1i128 << bits) - 1)));
    let signed = |bits: u32| {
        (
            Some(Num::Int(-(1i128 << (bits - 1)))),
            Some(Num::Int((1i128 << (bits - 1)) - 1)),
        )
    };
    match format {
        "uint8" => unsigned(8),
        "uint16" => unsigned(16),
        "uint32" => unsigned(32),
        "uint64" | "uint" => unsigned(64),
        "int8" => signed(8),
        "int16" => signed(16),
        "int32" => signed(32),
        "int64" | "int" => signed(64),
        _ => (None, None),
    }
}

fn type_matches(types: &Value, v: &Value) -> bool {
    let accepts = |t: &str| match (t, v) {
        ("null", Value::Null)
        | ("boolean", Value::Bool(_))
        | ("object", Value::Object(_))
        | ("array", Value::Array(_))
        | ("string", Value::String(_))
        | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(_)) => matches!(number(v), Some(Num::Int(_))),
        _ => false,
    };
    match types {
        Value::String(t) => accepts(t),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(accepts),
        _ => true,
    }
}

fn type_names(types: &Value) -> String {
    match types {
        Value::String(t) => a_type(t),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(a_type)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "valid".into(),
    }
}

fn a_type(t: &str) -> String {
    match t {
        "integer" => "an integer".into(),
        "object" => "an object".into(),
        "array" => "an array".into(),
        "string" => "a string".into(),
        "number" => "a number".into(),
        "boolean" => "true or false".into(),
        other => other.into(),
    }
}

/// Equality as JSON values, with numbers compared by value (1 and 1.0 alike, as
/// PostgreSQL's jsonb does).
fn same(a: &Value, b: &Value) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.cmp(&y) == Ordering::Equal,
        _ => a == b,
    }
}

fn is_null_type(branch: &Value) -> bool {
    branch.get("type").and_then(Value::as_str) == Some("null")
}

fn single_required(branch: &Value) -> Option<&String> {
    match branch
        .get("required")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        Some([Value::String(key)]) => Some(key),
        _ => None,
    }
}

/// What a branch of a choice is called in a message: its values, or its one key.
fn branch_names(branch: &Value) -> Vec<Value> {
    if let Some(values) = branch.get("enum").and_then(Value::as_array) {
        return values.clone();
    }
    if let Some(c) = branch.get("const") {
        return vec![c.clone()];
    }
    if let Some(key) = single_required(branch) {
        return vec![Value::String(key.clone())];
    }
    if is_null_type(branch) {
        return vec![Value::Null];
    }
    Vec::new()
}

/// Values as a message lists them: strings bare, the rest as JSON.
fn listed(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A value as a message shows it: its JSON, cut at 60 characters.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}
