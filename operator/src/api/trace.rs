//! A link direction driven by a packet-delivery trace (Mahimahi's format).

use kube::KubeSchema;
use nextmini_agent::sched::trace_shaper::{MAX_TRACE_ENTRIES, check_trace};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A packet-delivery trace in Mahimahi's format, replacing `rate` and `burst`: one
/// line per opportunity to deliver 1,500 bytes, each a whole number of milliseconds
/// from the start, never decreasing; several lines with the same number are several
/// opportunities in that millisecond. The trace repeats with the period of its last
/// line and starts when the link is built or the trace is applied. A trace set on a
/// more specific layer than `rate` wins over it, and the other way round. Give the
/// lines `inline` or name a ConfigMap key holding them (a trace file).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = kube::core::Rule::new("has(self.inline) != has(self.configMap)").message("set exactly one of inline, configMap"))]
pub struct TraceSpec {
    /// The trace's lines, e.g. `"1\n1\n2\n3\n"` (blank lines are skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub inline: Option<String>,
    /// A key of a ConfigMap in the topology's namespace (in local mode, a ConfigMap
    /// document of the same manifest) whose value is the trace's lines, e.g.
    /// created by `kubectl create configmap lte --from-file=down=trace.down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
}

/// A key of a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKey {
    /// The ConfigMap's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key whose value is the trace.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Why a trace's text is not a trace, naming the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TraceTextError(String);

impl TraceSpec {
    /// The trace's text; a ConfigMap's key must have been read into `inline`
    /// first (`plan::trace_sources`).
    pub fn text(&self) -> Result<&str, TraceTextError> {
        match (&self.inline, &self.config_map) {
            (Some(text), _) => Ok(text),
            (None, Some(c)) => Err(TraceTextError(format!(
                "ConfigMap {} key {} was not read",
                c.name, c.key
            ))),
            (None, None) => Err(TraceTextError(
                "set exactly one of inline, configMap".into(),
            )),
        }
    }

    /// The opportunities' offsets in milliseconds.
    pub fn opportunities(&self) -> Result<Vec<u32>, TraceTextError> {
        let mut ms = Vec::new();
        for (i, line) in self.text()?.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let value = line.parse::<u32>().map_err(|_| {
                TraceTextError(format!(
                    "line {}: {line:?} is not a whole number of milliseconds",
                    i + 1
                ))
            })?;
            ms.push(value);
            if ms.len() > MAX_TRACE_ENTRIES {
                return Err(TraceTextError(format!(
                    "more than {MAX_TRACE_ENTRIES} opportunities"
                )));
            }
        }
        check_trace(&ms).map_err(|e| TraceTextError(e.to_string()))?;
        Ok(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<u32>, String> {
        TraceSpec {
            inline: Some(text.into()),
            config_map: None,
        }
        .opportunities()
        .map_err(|e| e.to_string())
    }

    #[test]
    fn mahimahi_lines_become_offsets() {
        assert_eq!(parse("1\n1\n\n 4 \n10\n"), Ok(vec![1, 1, 4, 10]));
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(
            parse("1\n2\n2.5\n"),
            Err("line 3: \"2.5\" is not a whole number of milliseconds".into())
        );
        assert_eq!(
            parse("5\n3\n"),
            Err(
                "entry 1 (3 ms) is before the one above it (5 ms): offsets must not decrease"
                    .into()
            )
        );
        assert_eq!(parse("\n"), Err("no delivery opportunities".into()));
        assert_eq!(
            parse("0\n"),
            Err("the last entry is 0 ms: the period must be at least 1 ms".into())
        );
    }
}
