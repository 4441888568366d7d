use super::{Aqm, Verdict};
use crate::sched::{PacketMeta, QueueState};
use rand::rngs::SmallRng;

/// DCTCP-style marking: an ECN-capable packet is marked when more than `K` packets
/// are queued on its arrival. Others are accepted; only the queue limit drops them.
#[derive(Debug, Clone, Copy)]
pub struct EcnThreshold {
    threshold_packets: u32,
}

impl EcnThreshold {
    pub fn new(threshold_packets: u32) -> EcnThreshold {
        EcnThreshold { threshold_packets }
    }
}

impl Aqm for EcnThreshold {
    fn on_enqueue(&mut self, q: &QueueState, m: &PacketMeta, _: u64, _: &mut SmallRng) -> Verdict {
        if m.ecn_capable && q.packets > self.threshold_packets {
            Verdict::Mark
        } else {
            Verdict::Accept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn marks_only_ect_above_threshold() {
        let mut aqm = EcnThreshold::new(10);
        let mut rng = SmallRng::seed_from_u64(0);
        let ect = PacketMeta {
            ecn_capable: true,
            ..PacketMeta::with_len(1500)
        };
        let not_ect = PacketMeta::with_len(1500);
        for packets in 0..=20 {
            let q = QueueState {
                packets,
                ..Default::default()
            };
            let expected = if packets > 10 {
                Verdict::Mark
            } else {
                Verdict::Accept
            };
            assert_eq!(aqm.on_enqueue(&q, &ect, 0, &mut rng), expected, "{packets}");
            assert_eq!(aqm.on_enqueue(&q, &not_ect, 0, &mut rng), Verdict::Accept);
        }
    }
}
