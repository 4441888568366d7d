//! Classify: which queue a packet joins (Flexplane's `classify`).

use super::PacketMeta;

pub trait Classifier: Send + Sync {
    /// Queue index for the packet. The pipeline sends indices past the last queue
    /// to the last queue, so a classifier cannot make it panic.
    fn classify(&mut self, meta: &PacketMeta) -> usize;
}

/// One `ClassRule` from the control plane: every matcher that is set must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassRule {
    pub queue: usize,
    pub dscp: Option<u8>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    pub protocol: Option<u8>,
    /// Matches packets strictly smaller than this many bytes.
    pub max_packet_bytes: Option<u32>,
}

impl ClassRule {
    pub fn matches(&self, m: &PacketMeta) -> bool {
        self.dscp.is_none_or(|v| v == m.dscp)
            && self.src_port.is_none_or(|v| v == m.src_port)
            && self.dst_port.is_none_or(|v| v == m.dst_port)
            && self.protocol.is_none_or(|v| v == m.protocol)
            && self.max_packet_bytes.is_none_or(|v| m.len < v)
    }
}

/// First matching rule wins; unmatched packets go to `fallback`.
#[derive(Debug, Clone, Default)]
pub struct RuleClassifier {
    rules: Vec<ClassRule>,
    fallback: usize,
}

impl RuleClassifier {
    pub fn new(rules: Vec<ClassRule>, fallback: usize) -> RuleClassifier {
        RuleClassifier { rules, fallback }
    }
}

impl Classifier for RuleClassifier {
    fn classify(&mut self, meta: &PacketMeta) -> usize {
        self.rules
            .iter()
            .find(|r| r.matches(meta))
            .map_or(self.fallback, |r| r.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins_and_unmatched_fall_back() {
        let mut c = RuleClassifier::new(
            vec![
                ClassRule {
                    queue: 0,
                    dscp: Some(46),
                    ..Default::default()
                },
                ClassRule {
                    queue: 1,
                    protocol: Some(6),
                    dst_port: Some(80),
                    ..Default::default()
                },
                ClassRule {
                    queue: 2,
                    max_packet_bytes: Some(100),
                    ..Default::default()
                },
            ],
            3,
        );
        let m = |dscp, protocol, dst_port, len| PacketMeta {
            len,
            dscp,
            protocol,
            dst_port,
            ..Default::default()
        };
        assert_eq!(c.classify(&m(46, 6, 80, 1500)), 0);
        assert_eq!(c.classify(&m(0, 6, 80, 1500)), 1);
        assert_eq!(
            c.classify(&m(0, 17, 80, 1500)),
            3,
            "all matchers must match"
        );
        assert_eq!(c.classify(&m(0, 17, 80, 99)), 2);
        assert_eq!(c.classify(&m(0, 17, 80, 100)), 3, "strictly smaller");
        assert_eq!(RuleClassifier::default().classify(&m(0, 0, 0, 1)), 0);
    }
}
