//! Rules for link parameters. Each parameter set (`linkDefaults`, a link's own fields,
//! a `forward` / `backward` override) is checked on its own for ranges, units and
//! "exactly one" choices. Then each direction of each link is checked as inherited,
//! for what only the combination shows: classes naming a queue the scheduler lacks, RED
//! or ECN thresholds above the queue limit, and netem's two dependencies (reordering
//! needs a delay, a jitter distribution needs jitter).

use super::assemble::Draft;
use super::errors::{FieldError, ValidationErrors};
use super::model::MAX_DELAY;
use super::params::{aqm_of, limit_of, pick, queue_count};
use super::validate::MTU;
use crate::api::{
    AqmSpec, ClassSpec, LinkParamsSpec, MAX_BANDS, MAX_CLASSES, MAX_QUEUES, SchedulerSpec,
};
use crate::units::{Duration, Size};
use nextmini_agent::sched::schemes;
use std::collections::HashSet;

/// Checks `linkDefaults`, each link's own parameters and overrides, and each direction
/// of each link as it inherits them.
pub(crate) fn check(draft: &Draft, errors: &mut ValidationErrors) {
    let spec = &draft.doc.object.spec;
    let mtu = Some(spec.dataplane.mtu).filter(|m| MTU.contains(m));
    let mut reporter = Reporter::default();
    let document = draft.doc.origin.as_str();
    // Templates links fill in: each on its own, then as the links inherit them.
    for (spec, prefix) in draft.defaults.iter().chain(&draft.region_templates) {
        let template = Layer {
            spec,
            document,
            prefix: prefix.clone(),
            defaults: true,
        };
        reporter.check_set(&template, mtu, errors);
        reporter.check_direction(std::slice::from_ref(&template), errors);
    }
    for link in &draft.links {
        let inherited = draft.inherited(link);
        let own = Layer {
            spec: &link.params,
            document: link.document,
            prefix: link.params_field.clone(),
            defaults: false,
        };
        reporter.check_set(&own, mtu, errors);
        for (name, over) in [("forward", &link.forward), ("backward", &link.backward)] {
            let mut layers = inherited_layers(&inherited, document);
            layers.push(own.clone());
            if let Some(spec) = over {
                let over = Layer {
                    spec,
                    document: link.document,
                    prefix: format!("{}.{name}", link.params_field),
                    defaults: false,
                };
                reporter.check_set(&over, mtu, errors);
                layers.push(over);
            }
            reporter.check_direction(&layers, errors);
        }
    }
}

/// `Draft::inherited`'s layers as templates (what they leave unset is no error).
fn inherited_layers<'a>(
    inherited: &[(&'a LinkParamsSpec, &str)],
    document: &'a str,
) -> Vec<Layer<'a>> {
    inherited
        .iter()
        .map(|(spec, prefix)| Layer {
            spec,
            document,
            prefix: (*prefix).to_owned(),
            defaults: true,
        })
        .collect()
}

/// A scenario event's `set` (`prefix`, e.g. `spec.scenario.events[2].set`): on
/// its own, then over each direction of `link` as the link's own layers and the
/// `earlier` events' sets (each with its path) leave it.
pub(crate) fn check_event(
    draft: &Draft,
    link: &super::assemble::DraftLink,
    earlier: &[(&LinkParamsSpec, String)],
    set: &LinkParamsSpec,
    prefix: String,
    errors: &mut ValidationErrors,
) {
    let spec = &draft.doc.object.spec;
    let mtu = Some(spec.dataplane.mtu).filter(|m| MTU.contains(m));
    let mut reporter = Reporter::default();
    let document = draft.doc.origin.as_str();
    let inherited = draft.inherited(link);
    let this = Layer {
        spec: set,
        document,
        prefix,
        defaults: false,
    };
    reporter.check_set(&this, mtu, errors);
    for (name, over) in [("forward", &link.forward), ("backward", &link.backward)] {
        let mut layers = inherited_layers(&inherited, document);
        layers.push(Layer {
            spec: &link.params,
            document: link.document,
            prefix: link.params_field.clone(),
            defaults: false,
        });
        if let Some(spec) = over {
            layers.push(Layer {
                spec,
                document: link.document,
                prefix: format!("{}.{name}", link.params_field),
                defaults: false,
            });
        }
        for (spec, prefix) in earlier {
            layers.push(Layer {
                spec,
                document,
                prefix: prefix.clone(),
                defaults: false,
            });
        }
        layers.push(this.clone());
        reporter.check_direction(&layers, errors);
    }
}

/// One parameter set and where it was written.
#[derive(Clone)]
struct Layer<'a> {
    spec: &'a LinkParamsSpec,
    document: &'a str,
    /// Path of the set, e.g. `spec.linkDefaults`, `spec` or `spec.links[1].forward`.
    prefix: String,
    /// Whether this is the topology's `linkDefaults`: a template links fill in, so
    /// what it leaves for links to supply is not an error.
    defaults: bool,
}

impl Layer<'_> {
    fn error(&self, field: impl AsRef<str>, reason: impl Into<String>) -> FieldError {
        FieldError::new(
            self.document,
            format!("{}.{}", self.prefix, field.as_ref()),
            reason,
        )
    }

    /// The path of `field` for a message about another layer's field.
    fn path(&self, field: &str, from: &Layer) -> String {
        if self.document == from.document {
            format!("{}.{field}", self.prefix)
        } else {
            format!("{}.{field} in {}", self.prefix, self.document)
        }
    }
}

/// Reports each problem once: the two directions of a link, and the links of a
/// generator, inherit the same sets and would otherwise repeat it.
#[derive(Default)]
struct Reporter {
    seen: HashSet<FieldError>,
}

impl Reporter {
    /// Checks one set on its own. `mtu` is `None` when the topology's MTU is itself
    /// invalid, which skips the checks that depend on it.
    fn check_set(&mut self, layer: &Layer, mtu: Option<u32>, errors: &mut ValidationErrors) {
        let mut found = Vec::new();
        set_rules(layer, mtu, &mut found);
        self.report(found, errors);
    }

    /// Checks one direction of a link as inherited; `layers` go from least to most
    /// specific. With `linkDefaults` alone, checks what the defaults combine on their own.
    fn check_direction(&mut self, layers: &[Layer], errors: &mut ValidationErrors) {
        let mut found = Vec::new();
        Direction::new(layers).rules(&mut found);
        self.report(found, errors);
    }

    fn report(&mut self, found: Vec<FieldError>, errors: &mut ValidationErrors) {
        for e in found {
            if self.seen.insert(e.clone()) {
                errors.0.push(e);
            }
        }
    }
}

fn set_rules(layer: &Layer, mtu: Option<u32>, out: &mut Vec<FieldError>) {
    let p = layer.spec;
    if let Some(trace) = &p.trace {
        // An unread ConfigMap was reported where it was read (`trace_sources`).
        if trace.inline.is_some()
            && let Err(e) = trace.opportunities()
        {
            match &trace.config_map {
                Some(c) => out.push(layer.error(
                    "trace.configMap",
                    format!("ConfigMap {} key {}: {e}", c.name, c.key),
                )),
                None => out.push(layer.error("trace.inline", e.to_string())),
            }
        }
        for (field, set) in [("rate", p.rate.is_some()), ("burst", p.burst.is_some())] {
            if set {
                out.push(layer.error(
                    field,
                    "set either a rate (and burst) or a trace here: the trace decides when packets leave",
                ));
            }
        }
    }
    if p.rate.is_some_and(|r| r.bps() == 0) {
        out.push(layer.error(
            "rate",
            "must be greater than 0 (leave it unset for an unlimited link)",
        ));
    }
    match p.burst {
        Some(Size::Packets(_)) => out.push(layer.error("burst", "must be in bytes, e.g. 64KiB")),
        Some(Size::Bytes(b)) => {
            at_least_a_packet(
                layer,
                "burst",
                b,
                mtu,
                "could never send a full-size packet",
                out,
            );
        }
        None => {}
    }
    for (field, d) in [("delay", p.delay), ("jitter", p.jitter)] {
        if let Some(d) = d.filter(|d| d.as_std() > MAX_DELAY) {
            out.push(layer.error(
                field,
                format!(
                    "must be at most {}s, got {d} (a link holds every packet that long)",
                    MAX_DELAY.as_secs()
                ),
            ));
        }
        if let Some(d) = d.filter(|d| d.as_std().subsec_nanos() % 1_000 != 0) {
            out.push(layer.error(
                field,
                format!("{d} is not a whole number of microseconds, the dataplane's resolution"),
            ));
        }
    }
    if let Some(queue) = &p.queue {
        match queue.limit {
            Some(Size::Packets(0)) => {
                out.push(layer.error("queue.limit", "must hold at least 1 packet"))
            }
            Some(Size::Packets(n)) if n > u64::from(u32::MAX) => out.push(layer.error(
                "queue.limit",
                format!("must be at most {}pkt, got {n}pkt", u32::MAX),
            )),
            Some(Size::Bytes(b)) => at_least_a_packet(
                layer,
                "queue.limit",
                b,
                mtu,
                "could never hold a full-size packet",
                out,
            ),
            _ => {}
        }
        if let Some(aqm) = &queue.aqm {
            aqm_rules(layer, aqm, out);
        }
    }
    if let Some(scheduler) = &p.scheduler {
        scheduler_rules(layer, scheduler, out);
    }
    if let Some(classes) = &p.classes {
        class_rules(layer, classes, out);
    }
}

/// A byte count that must hold at least one MTU-sized packet.
fn at_least_a_packet(
    layer: &Layer,
    field: &str,
    bytes: u64,
    mtu: Option<u32>,
    otherwise: &str,
    out: &mut Vec<FieldError>,
) {
    match mtu {
        Some(mtu) if bytes < u64::from(mtu) => out.push(layer.error(
            field,
            format!("must be at least the MTU ({mtu} bytes), got {bytes} bytes: it {otherwise}"),
        )),
        None if bytes == 0 => out.push(layer.error(field, "must be greater than 0")),
        _ => {}
    }
}

fn aqm_rules(layer: &Layer, aqm: &AqmSpec, out: &mut Vec<FieldError>) {
    if aqm.kinds_set() != 1 {
        out.push(layer.error("queue.aqm", "set exactly one of taildrop, red, ecn, scheme"));
    }
    if let Some(scheme) = &aqm.scheme {
        let settings = scheme.settings.clone().unwrap_or_default();
        if let Err(e) = schemes::find_aqm(&scheme.name).and_then(|a| a.check(&settings)) {
            out.push(layer.error(format!("queue.aqm.scheme.{}", e.field()), e.reason()));
        }
    }
    if let Some(red) = &aqm.red {
        if red.min >= red.max {
            out.push(layer.error(
                "queue.aqm.red.min",
                format!("must be less than max ({}), got {}", red.max, red.min),
            ));
        }
        if red.max_p.ppm() == 0 {
            out.push(layer.error(
                "queue.aqm.red.maxP",
                "must be greater than 0% (at most 100%)",
            ));
        }
        if red.weight.ppm() == 0 {
            out.push(layer.error("queue.aqm.red.weight", "must be greater than 0 (at most 1)"));
        }
    }
    if aqm.ecn.as_ref().is_some_and(|e| e.threshold == 0) {
        out.push(layer.error("queue.aqm.ecn.threshold", "must be at least 1 packet"));
    }
}

fn scheduler_rules(layer: &Layer, s: &SchedulerSpec, out: &mut Vec<FieldError>) {
    if s.kinds_set() != 1 {
        out.push(layer.error(
            "scheduler",
            "set exactly one of fcfs, wrr, drr, priority, scheme",
        ));
    }
    if let Some(scheme) = &s.scheme {
        let settings = scheme.settings.clone().unwrap_or_default();
        if let Err(e) = schemes::find_scheduler(&scheme.name).and_then(|e| e.queues(&settings)) {
            out.push(layer.error(format!("scheduler.scheme.{}", e.field()), e.reason()));
        }
    }
    let count = |field: &str, n: usize, out: &mut Vec<FieldError>| {
        if n == 0 {
            out.push(layer.error(field, "must list at least one value, one per queue"));
        } else if n > MAX_QUEUES {
            out.push(layer.error(
                field,
                format!("lists {n} queues; at most {MAX_QUEUES} are allowed"),
            ));
        }
    };
    if let Some(wrr) = &s.wrr {
        count("scheduler.wrr.weights", wrr.weights.len(), out);
        for (i, _) in wrr.weights.iter().enumerate().filter(|&(_, &w)| w == 0) {
            out.push(layer.error(
                format!("scheduler.wrr.weights[{i}]"),
                "must be greater than 0",
            ));
        }
    }
    if let Some(drr) = &s.drr {
        count("scheduler.drr.quantum", drr.quantum.len(), out);
        for (i, q) in drr.quantum.iter().enumerate() {
            if let Some(reason) = u32_bytes_problem(*q, "1500") {
                out.push(layer.error(format!("scheduler.drr.quantum[{i}]"), reason));
            }
        }
    }
    if let Some(priority) = &s.priority
        && !(1..=MAX_BANDS).contains(&priority.bands)
    {
        out.push(layer.error(
            "scheduler.priority.bands",
            format!("must be between 1 and {MAX_BANDS}, got {}", priority.bands),
        ));
    }
}

/// Why `size` is not a positive byte count that fits in 32 bits, if it is not.
fn u32_bytes_problem(size: Size, example: &str) -> Option<String> {
    match size {
        Size::Packets(_) => Some(format!("must be in bytes, e.g. {example}")),
        Size::Bytes(0) => Some("must be greater than 0".to_owned()),
        Size::Bytes(b) if b > u64::from(u32::MAX) => {
            Some(format!("must be at most {} bytes, got {b}", u32::MAX))
        }
        Size::Bytes(_) => None,
    }
}

fn class_rules(layer: &Layer, classes: &[ClassSpec], out: &mut Vec<FieldError>) {
    if classes.len() > MAX_CLASSES {
        out.push(layer.error(
            "classes",
            format!(
                "lists {} rules; at most {MAX_CLASSES} are allowed",
                classes.len()
            ),
        ));
    }
    for (i, c) in classes.iter().enumerate() {
        let field = |name: &str| format!("classes[{i}].{name}");
        if let Some(dscp) = c.dscp.filter(|&d| d > 63) {
            out.push(layer.error(
                field("dscp"),
                format!("must be between 0 and 63, got {dscp}"),
            ));
        }
        for (name, port) in [("srcPort", c.src_port), ("dstPort", c.dst_port)] {
            if let Some(port) = port.filter(|p| !(1..=65_535).contains(p)) {
                out.push(layer.error(
                    field(name),
                    format!("must be between 1 and 65535, got {port}"),
                ));
            }
        }
        if let Some(reason) = c.max_packet_size.and_then(|s| u32_bytes_problem(s, "128")) {
            out.push(layer.error(field("maxPacketSize"), reason));
        }
    }
}

/// One direction of a link as inherited.
struct Direction<'l, 'a> {
    layers: &'l [Layer<'a>],
    specs: Vec<&'a LinkParamsSpec>,
    /// Only `linkDefaults`: checked once per topology, for its own combinations.
    defaults_alone: bool,
}

impl<'l, 'a> Direction<'l, 'a> {
    fn new(layers: &'l [Layer<'a>]) -> Self {
        Direction {
            layers,
            specs: layers.iter().map(|l| l.spec).collect(),
            defaults_alone: layers.iter().all(|l| l.defaults),
        }
    }

    /// Whether a problem between fields of these layers is this view's to report: one
    /// lying wholly in `linkDefaults` is reported once, by the defaults-alone view.
    fn owns(&self, blamed: usize) -> bool {
        self.defaults_alone || !self.layers[blamed].defaults
    }

    fn rules(&self, out: &mut Vec<FieldError>) {
        self.classes_fit_the_scheduler(out);
        self.thresholds_fit_the_limit(out);
        if !self.defaults_alone {
            self.netem_dependencies(out);
        }
    }

    fn classes_fit_the_scheduler(&self, out: &mut Vec<FieldError>) {
        let Some((classes, ci)) = pick(&self.specs, |s| s.classes.as_ref()) else {
            return;
        };
        let scheduler = pick(&self.specs, |s| s.scheduler.as_ref());
        let class_layer = &self.layers[ci];
        if let Some((spec, si)) = scheduler
            && let Some(scheme) = &spec.scheme
            && schemes::find_scheduler(&scheme.name).is_ok_and(|e| e.classifies)
        {
            if !classes.is_empty() && self.owns(ci) {
                out.push(class_layer.error(
                    "classes",
                    format!(
                        "the {} scheduler at {} sorts packets into its queues itself; remove classes",
                        scheme.name,
                        self.layers[si].path("scheduler", class_layer)
                    ),
                ));
            }
            return;
        }
        let Some(n) = queue_count(scheduler.map(|(s, _)| s)).filter(|&n| n > 0) else {
            return; // a scheduler without a single kind or queues is reported on its own
        };
        for (i, c) in classes.iter().enumerate() {
            if usize::try_from(c.queue).is_ok_and(|q| q < n) {
                continue;
            }
            match scheduler {
                Some((_, si)) if si > ci => {
                    if self.owns(si) {
                        let s = &self.layers[si];
                        out.push(s.error(
                            "scheduler",
                            format!(
                                "has {n} queue(s), but {} sends packets to queue {}",
                                class_layer.path(&format!("classes[{i}]"), s),
                                c.queue
                            ),
                        ));
                    }
                }
                Some((_, si)) => {
                    if self.owns(ci) {
                        let s = &self.layers[si];
                        out.push(class_layer.error(
                            format!("classes[{i}].queue"),
                            format!(
                                "queue {} does not exist: the scheduler at {} has {n} queue(s), 0 to {}",
                                c.queue,
                                s.path("scheduler", class_layer),
                                n - 1
                            ),
                        ));
                    }
                }
                None => {
                    if self.owns(ci) {
                        out.push(class_layer.error(
                            format!("classes[{i}].queue"),
                            format!(
                                "queue {} does not exist: without a scheduler the link has one queue, 0",
                                c.queue
                            ),
                        ));
                    }
                }
            }
        }
    }

    fn thresholds_fit_the_limit(&self, out: &mut Vec<FieldError>) {
        let Some((Size::Packets(limit), li)) = pick(&self.specs, limit_of) else {
            return;
        };
        let Some((aqm, ai)) = pick(&self.specs, aqm_of) else {
            return;
        };
        let threshold = match (&aqm.red, &aqm.ecn) {
            (Some(red), _) => ("queue.aqm.red.max", red.max),
            (None, Some(ecn)) => ("queue.aqm.ecn.threshold", ecn.threshold),
            (None, None) => return,
        };
        let (field, value) = threshold;
        if u64::from(value) <= limit {
            return;
        }
        let (aqm_layer, limit_layer) = (&self.layers[ai], &self.layers[li]);
        if ai >= li {
            if self.owns(ai) {
                out.push(aqm_layer.error(
                    field,
                    format!(
                        "must not exceed the queue limit of {limit} packets ({}), got {value}: the queue could never get that long",
                        limit_layer.path("queue.limit", aqm_layer)
                    ),
                ));
            }
        } else if self.owns(li) {
            out.push(limit_layer.error(
                "queue.limit",
                format!(
                    "is below the {value} packets of {}: the queue could never get that long",
                    aqm_layer.path(field, limit_layer)
                ),
            ));
        }
    }

    /// netem's rules: reordered packets are the ones sent without the delay, so
    /// reordering needs a delay; a distribution shapes jitter, so it needs jitter. Only
    /// values a link sets itself are held to them: `linkDefaults` is a template.
    fn netem_dependencies(&self, out: &mut Vec<FieldError>) {
        let reorder = pick(&self.specs, |s| s.reorder).filter(|(r, _)| r.ppm() > 0);
        self.needs(
            ("reorder", reorder.map(|(_, i)| i)),
            ("delay", pick(&self.specs, |s| s.delay)),
            "reordered packets are the ones sent without the delay",
            out,
        );
        let distribution = pick(&self.specs, |s| s.jitter_distribution);
        self.needs(
            ("jitterDistribution", distribution.map(|(_, i)| i)),
            ("jitter", pick(&self.specs, |s| s.jitter)),
            "the distribution shapes the jitter",
            out,
        );
    }

    /// `field`, set at a layer, needs the duration `needed` to be positive. Blames
    /// whichever of the two was written more specifically.
    fn needs(
        &self,
        (field, set_at): (&str, Option<usize>),
        (needs, needed): (&str, Option<(Duration, usize)>),
        why: &str,
        out: &mut Vec<FieldError>,
    ) {
        let Some(di) = set_at.filter(|&i| !self.layers[i].defaults) else {
            return;
        };
        let dependent = &self.layers[di];
        match needed {
            Some((d, _)) if !d.as_std().is_zero() => {}
            Some((_, ni)) if ni > di => out.push(self.layers[ni].error(
                needs,
                format!(
                    "must be greater than 0 for {} ({why})",
                    dependent.path(field, &self.layers[ni])
                ),
            )),
            _ => out.push(dependent.error(
                field,
                format!("needs a {needs} greater than 0 ({why}), as with netem"),
            )),
        }
    }
}
