//! Merging OpenMetrics text expositions: the hub serves its own metrics and
//! every local agent's on one endpoint. OpenMetrics wants each metric family
//! once, with all its samples together, and one `# EOF` at the end; plain
//! concatenation would repeat families, so samples are regrouped by family.

use std::collections::HashMap;

#[derive(Debug, Default)]
struct Family {
    name: String,
    /// HELP / TYPE / UNIT lines, from the first exposition that had the family.
    meta: Vec<String>,
    samples: Vec<String>,
}

/// The metric name of a sample line (`name{labels} value` or `name value`).
fn sample_name(line: &str) -> &str {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    &line[..end]
}

/// Whether a sample named `sample` belongs to the family `family` (counters add
/// `_total`, histograms `_bucket`, `_sum` and `_count`, and so on).
fn belongs(sample: &str, family: &str) -> bool {
    sample == family
        || sample
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('_'))
}

/// One exposition made of all `parts`, each a complete exposition (its `# EOF`
/// optional). Families keep the order in which they were first seen.
pub fn merge<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut families: Vec<Family> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut lookup = |families: &mut Vec<Family>, name: &str| -> (usize, bool) {
        if let Some(i) = index.get(name) {
            return (*i, false);
        }
        families.push(Family {
            name: name.to_string(),
            ..Family::default()
        });
        index.insert(name.to_string(), families.len() - 1);
        (families.len() - 1, true)
    };
    for part in parts {
        let mut current: Option<usize> = None;
        // Families this part introduced: only their metadata is kept.
        let mut introduced: Vec<usize> = Vec::new();
        for line in part.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if line == "# EOF" {
                break;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut words = rest.splitn(3, ' ');
                let (Some(kind), Some(name)) = (words.next(), words.next()) else {
                    continue;
                };
                if !matches!(kind, "HELP" | "TYPE" | "UNIT") {
                    continue;
                }
                let (i, new) = lookup(&mut families, name);
                if new {
                    introduced.push(i);
                }
                if introduced.contains(&i) {
                    families[i].meta.push(line.to_string());
                }
                current = Some(i);
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name = sample_name(line);
            let i = match current {
                Some(i) if belongs(name, &families[i].name) => i,
                // A sample with no metadata before it: an untyped family of its own.
                _ => {
                    let (i, _) = lookup(&mut families, name);
                    current = Some(i);
                    i
                }
            };
            families[i].samples.push(line.to_string());
        }
    }
    let mut out = String::new();
    for f in &families {
        for line in f.meta.iter().chain(&f.samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "# HELP x_bytes Bytes.\n# TYPE x_bytes counter\n# UNIT x_bytes bytes\n\
        x_bytes_total{node=\"a\"} 1\n# HELP up Up.\n# TYPE up gauge\nup{node=\"a\"} 1\n# EOF\n";
    const B: &str = "# HELP x_bytes Bytes.\n# TYPE x_bytes counter\n# UNIT x_bytes bytes\n\
        x_bytes_total{node=\"b\"} 2\n# HELP up Up.\n# TYPE up gauge\nup{node=\"b\"} 0\n# EOF\n";

    #[test]
    fn families_appear_once_with_all_samples() {
        let merged = merge([A, B]);
        assert_eq!(
            merged,
            "# HELP x_bytes Bytes.\n# TYPE x_bytes counter\n# UNIT x_bytes bytes\n\
             x_bytes_total{node=\"a\"} 1\nx_bytes_total{node=\"b\"} 2\n\
             # HELP up Up.\n# TYPE up gauge\nup{node=\"a\"} 1\nup{node=\"b\"} 0\n# EOF\n"
        );
    }

    #[test]
    fn histograms_keep_their_suffixed_samples() {
        let h = "# TYPE d_seconds histogram\nd_seconds_bucket{le=\"1\"} 1\nd_seconds_bucket{le=\"+Inf\"} 1\n\
                 d_seconds_sum 0.5\nd_seconds_count 1\n# EOF\n";
        let merged = merge([h, "# TYPE d_seconds histogram\nd_seconds_count 0\n# EOF\n"]);
        assert_eq!(merged.matches("# TYPE d_seconds histogram").count(), 1);
        assert!(merged.contains("d_seconds_count 1\nd_seconds_count 0\n"));
    }

    #[test]
    fn untyped_samples_and_empty_parts_survive() {
        let merged = merge(["", "plain 3\n", "# EOF\n"]);
        assert_eq!(merged, "plain 3\n# EOF\n");
        assert_eq!(merge(Vec::<&str>::new()), "# EOF\n");
    }
}
