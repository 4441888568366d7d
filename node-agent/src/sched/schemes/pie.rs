//! PIE, Proportional Integral controller Enhanced (RFC 8033): drops arriving
//! packets with a probability that a controller moves, every `tupdate`, by how far
//! the queueing delay is from `target` and how fast it grows. It keeps delay near
//! the target whatever the load, where RED needs its thresholds tuned to the rate.
//!
//! The delay is estimated as the queue's bytes over the link's rate, so PIE acts
//! on shaped links only: an unshaped link never queues.
//!
//! ```yaml
//! queue:
//!   aqm:
//!     scheme:
//!       name: pie
//!       settings: {targetMs: 15, ecn: true}
//! ```

use super::{AqmScheme, LinkContext, SettingsError};
use crate::sched::{Aqm, PacketMeta, QueueState, Verdict};
use rand::Rng;
use rand::rngs::SmallRng;
use serde::Deserialize;

pub struct Pie;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Settings {
    /// Queueing delay the controller steers to, in milliseconds (RFC 8033: 15).
    pub target_ms: f64,
    /// How often the drop probability is updated, in milliseconds (15).
    pub tupdate_ms: f64,
    /// Gain on the distance from the target, per second (0.125).
    pub alpha: f64,
    /// Gain on the delay's growth, per second (1.25).
    pub beta: f64,
    /// A burst this long, in milliseconds, passes an idle queue undropped (150).
    pub max_burst_ms: f64,
    /// Mark ECN-capable packets instead of dropping them while the probability is
    /// at most 10%.
    pub ecn: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            target_ms: 15.0,
            tupdate_ms: 15.0,
            alpha: 0.125,
            beta: 1.25,
            max_burst_ms: 150.0,
            ecn: false,
        }
    }
}

impl AqmScheme for Pie {
    const NAME: &'static str = "pie";
    const SUMMARY: &'static str =
        "RFC 8033 PIE; settings: targetMs, tupdateMs, alpha, beta, maxBurstMs, ecn";
    type Settings = Settings;

    fn check(s: &Settings) -> Result<(), SettingsError> {
        let positive = |field: &str, v: f64, max: f64| {
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(())
            } else {
                Err(SettingsError::new(
                    field,
                    format!("must be above 0 and at most {max}, got {v}"),
                ))
            }
        };
        positive("targetMs", s.target_ms, 60_000.0)?;
        positive("tupdateMs", s.tupdate_ms, 60_000.0)?;
        positive("alpha", s.alpha, 1_000.0)?;
        positive("beta", s.beta, 1_000.0)?;
        if !(s.max_burst_ms.is_finite() && (0.0..=60_000.0).contains(&s.max_burst_ms)) {
            return Err(SettingsError::new(
                "maxBurstMs",
                format!("must be between 0 and 60000, got {}", s.max_burst_ms),
            ));
        }
        Ok(())
    }

    fn build(s: &Settings, link: &LinkContext) -> Box<dyn Aqm> {
        let ms = |v: f64| (v * 1e6) as u64;
        Box::new(PieState {
            target_s: s.target_ms / 1e3,
            tupdate_ns: ms(s.tupdate_ms).max(1),
            alpha: s.alpha,
            beta: s.beta,
            max_burst_ns: ms(s.max_burst_ms),
            ecn: s.ecn,
            rate_bps: link.rate_bps,
            mtu: u64::from(link.mtu),
            drop_prob: 0.0,
            qdelay_old_s: 0.0,
            burst_allowance_ns: ms(s.max_burst_ms),
            last_update: None,
        })
    }
}

struct PieState {
    target_s: f64,
    tupdate_ns: u64,
    alpha: f64,
    beta: f64,
    max_burst_ns: u64,
    ecn: bool,
    rate_bps: u64,
    mtu: u64,
    drop_prob: f64,
    qdelay_old_s: f64,
    burst_allowance_ns: u64,
    last_update: Option<u64>,
}

impl PieState {
    fn qdelay_s(&self, queue: &QueueState) -> f64 {
        match self.rate_bps {
            0 => 0.0,
            rate => queue.bytes as f64 * 8.0 / rate as f64,
        }
    }

    /// RFC 8033 section 4.2, once per `tupdate`.
    fn update(&mut self, qdelay_s: f64) {
        let mut p =
            self.alpha * (qdelay_s - self.target_s) + self.beta * (qdelay_s - self.qdelay_old_s);
        // Small probabilities move in small steps (the RFC's auto-tuning).
        p /= match self.drop_prob {
            d if d < 0.000_001 => 2048.0,
            d if d < 0.000_01 => 512.0,
            d if d < 0.000_1 => 128.0,
            d if d < 0.001 => 32.0,
            d if d < 0.01 => 8.0,
            d if d < 0.1 => 2.0,
            _ => 1.0,
        };
        self.drop_prob += p;
        if qdelay_s == 0.0 && self.qdelay_old_s == 0.0 {
            self.drop_prob *= 0.98;
        }
        self.drop_prob = self.drop_prob.clamp(0.0, 1.0);
        self.burst_allowance_ns = self.burst_allowance_ns.saturating_sub(self.tupdate_ns);
        let half = self.target_s / 2.0;
        if self.drop_prob == 0.0 && qdelay_s < half && self.qdelay_old_s < half {
            self.burst_allowance_ns = self.max_burst_ns;
        }
        self.qdelay_old_s = qdelay_s;
    }
}

impl Aqm for PieState {
    fn on_enqueue(
        &mut self,
        queue: &QueueState,
        meta: &PacketMeta,
        now: u64,
        rng: &mut SmallRng,
    ) -> Verdict {
        let qdelay = self.qdelay_s(queue);
        let last = *self.last_update.get_or_insert(now);
        // The periods that passed since the last arrival, at most a second's worth:
        // an idle queue had the same (empty) delay all along.
        let periods =
            (now.saturating_sub(last) / self.tupdate_ns).min(1_000_000_000 / self.tupdate_ns + 1);
        for _ in 0..periods {
            self.update(qdelay);
        }
        self.last_update = Some(last + periods * self.tupdate_ns);
        if self.burst_allowance_ns > 0
            || (self.qdelay_old_s < self.target_s / 2.0 && self.drop_prob < 0.2)
            || queue.bytes <= 2 * self.mtu
            || !rng.random_bool(self.drop_prob)
        {
            return Verdict::Accept;
        }
        if self.ecn && meta.ecn_capable && self.drop_prob <= 0.1 {
            Verdict::Mark
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sched::{PacketMeta, Pipeline};
    use nextmini_proto::v1 as pb;

    const MTU: u32 = 1500;

    /// 10 Mbit/s with room for 2,000 packets (2.4 s of queue), and `aqm`.
    fn link(aqm: Option<pb::queue_config::Aqm>) -> pb::LinkParams {
        pb::LinkParams {
            rate_bps: 10_000_000,
            queue: Some(pb::QueueConfig {
                limit_packets: 2_000,
                aqm,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pie(settings: serde_json::Value) -> Option<pb::queue_config::Aqm> {
        Some(pb::queue_config::Aqm::Scheme(pb::SchemeConfig {
            name: "pie".into(),
            settings_json: settings.to_string(),
        }))
    }

    /// Offers 1500-byte packets at twice the link's rate for 6 s; returns the
    /// queueing delay (queue bytes over the rate) averaged over the last 3 s, in ms.
    fn standing_delay_ms(pipeline: &mut Pipeline<Vec<u8>>) -> f64 {
        let gap = 600_000; // ns: 20 Mbit/s of 1500-byte packets
        let (mut sum, mut samples) = (0.0, 0u32);
        let mut out = Vec::new();
        for i in 0..10_000u64 {
            let now = i * gap;
            pipeline.enqueue(vec![0u8; MTU as usize], PacketMeta::with_len(MTU), now);
            out.clear();
            pipeline.poll_into(now, &mut out);
            if now >= 3_000_000_000 {
                let bytes: u64 = pipeline.stats().per_queue.iter().map(|q| q.bytes).sum();
                sum += bytes as f64 * 8.0 / 10_000_000.0 * 1e3;
                samples += 1;
            }
        }
        sum / f64::from(samples)
    }

    #[test]
    fn pie_holds_the_delay_near_its_target_where_taildrop_fills_the_queue() {
        let mut taildrop: Pipeline<Vec<u8>> = Pipeline::new(&link(None), MTU, 7).expect("valid");
        let mut pie15: Pipeline<Vec<u8>> =
            Pipeline::new(&link(pie(serde_json::json!({}))), MTU, 7).expect("valid");
        let mut pie5: Pipeline<Vec<u8>> =
            Pipeline::new(&link(pie(serde_json::json!({"targetMs": 5}))), MTU, 7).expect("valid");
        let (t, p15, p5) = (
            standing_delay_ms(&mut taildrop),
            standing_delay_ms(&mut pie15),
            standing_delay_ms(&mut pie5),
        );
        println!("standing delay: taildrop {t:.0} ms, PIE 15 ms {p15:.1} ms, PIE 5 ms {p5:.1} ms");
        assert!(t > 2_000.0, "taildrop should fill its 2.4 s queue: {t}");
        assert!((5.0..40.0).contains(&p15), "PIE target 15 ms: {p15}");
        assert!(
            p5 < p15 && p5 < 15.0,
            "PIE target 5 ms: {p5} (15 ms: {p15})"
        );
    }

    #[test]
    fn a_rate_set_later_reaches_pie() {
        // Built unshaped, PIE has no rate to estimate delay from and never drops;
        // shaped by a change, it must get the rate.
        let settings = serde_json::json!({"targetMs": 5});
        let unshaped = pb::LinkParams {
            rate_bps: 0,
            ..link(pie(settings.clone()))
        };
        let mut pipeline: Pipeline<Vec<u8>> = Pipeline::new(&unshaped, MTU, 7).expect("valid");
        pipeline.reconfigure(&link(pie(settings))).expect("valid");
        let delay = standing_delay_ms(&mut pipeline);
        assert!(
            delay < 40.0,
            "PIE held {delay:.1} ms after the link got a rate"
        );
    }

    #[test]
    fn bad_settings_are_refused_by_field() {
        let err = |settings: serde_json::Value| {
            Pipeline::<Vec<u8>>::new(&link(pie(settings)), MTU, 1)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            err(serde_json::json!({"targetMs": 0})),
            "queue.aqm.scheme.settings.targetMs: must be above 0 and at most 60000, got 0"
        );
        assert!(
            err(serde_json::json!({"target": 5}))
                .starts_with("queue.aqm.scheme.settings.target: unknown field `target`"),
            "{}",
            err(serde_json::json!({"target": 5}))
        );
    }
}
