//! A timer with sub-millisecond resolution. tokio's timer wheel rounds every
//! sleep up to the next millisecond, which would add up to a millisecond to each
//! emulated delay and bunch paced packets; a timerfd wakes within microseconds
//! of its expiry on bare metal.
//!
//! On a virtual machine the thread that waits for the timerfd wakes 100–200 µs
//! after the expiry (the idle vCPU has to be scheduled again by the host), which
//! made every emulated delay that much longer: a 10 ms link measured 10.27 ms.
//! A precise sleep therefore arms the timerfd early by the wake-up latency it
//! has learned and spins out the rest. Spinning costs CPU, so it is only for
//! callers that ask for it (a link holding a lone packet, not a busy one whose
//! packets leave in batches anyway) and within a process-wide budget.

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

/// The most a precise sleep arms early (and so spins): a wake-up later than
/// this is a machine short of CPU, not a latency worth hiding.
const MAX_LEAD: Duration = Duration::from_micros(400);

/// Spinning allowed to the whole process, as a share of one core: beyond it a
/// precise sleep is an ordinary one.
const SPIN_BUDGET_PER_SECOND: Duration = Duration::from_millis(10);

/// The quantile of the wake-up latency a precise sleep arms ahead by: most
/// wake-ups are then early and spin a little, few are late.
const LEAD_QUANTILE: f64 = 0.8;

/// How far one sample moves the latency estimate.
const ESTIMATE_STEP_NS: f64 = 4_000.0;

/// The machine's wake-up latency is the same for every timer of the process,
/// and a link's timer lives only as long as its connection: one estimate,
/// shared, so a new connection's first packets already leave on time. Updates
/// race harmlessly (a lost step of a few microseconds).
static WAKE_LATENCY: Mutex<LatencyEstimate> = Mutex::new(LatencyEstimate::INITIAL);

pub struct PreciseTimer {
    fd: AsyncFd<Fd>,
    /// The instant the timerfd is armed for, until it is seen to fire: a
    /// caller that sleeps again towards the same deadline (its select woke for
    /// something else) needs no `timerfd_settime`, which was a tenth of a busy
    /// link's CPU.
    armed: Option<Instant>,
}

/// tokio's AsyncFd wants `AsRawFd`; nix's TimerFd offers `AsFd`.
struct Fd(TimerFd);

impl std::os::fd::AsRawFd for Fd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl PreciseTimer {
    pub fn new() -> std::io::Result<PreciseTimer> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: `register` requires the descriptor to stay open while it is
        // registered. `Fd` owns it and lives inside the AsyncFd, which deregisters
        // before dropping its inner value, so the descriptor outlives the registration.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register(Fd(fd)) }.map_err(|e| e.into_parts().1)?;
        Ok(PreciseTimer { fd, armed: None })
    }

    /// Resolves at `deadline` or after it (immediately if it has passed).
    pub async fn sleep_until(&mut self, deadline: Instant) -> std::io::Result<()> {
        self.sleep(deadline, false).await
    }

    /// Like [`PreciseTimer::sleep_until`], but hides the wake-up latency by
    /// waking early and spinning, while the process's spin budget lasts. Never
    /// resolves before `deadline`.
    pub async fn sleep_until_precisely(&mut self, deadline: Instant) -> std::io::Result<()> {
        self.sleep(deadline, true).await
    }

    async fn sleep(&mut self, deadline: Instant, precise: bool) -> std::io::Result<()> {
        let now = Instant::now();
        if deadline <= now {
            return Ok(());
        }
        let lead = if precise {
            WAKE_LATENCY.lock().map_or(Duration::ZERO, |e| e.lead())
        } else {
            Duration::ZERO
        };
        let fire_at = deadline - lead;
        if fire_at > now {
            self.wait_for_expiry(fire_at, now).await?;
            if !lead.is_zero() {
                let latency = Instant::now().saturating_duration_since(fire_at);
                if let Ok(mut e) = WAKE_LATENCY.lock() {
                    e.observe(latency);
                }
            }
        }
        // Only a lead makes the wake-up early: a timerfd armed for the
        // deadline itself never fires before it.
        if !lead.is_zero() {
            spin_until(deadline);
        }
        Ok(())
    }

    async fn wait_for_expiry(&mut self, fire_at: Instant, now: Instant) -> std::io::Result<()> {
        if self.armed != Some(fire_at) {
            let wait = fire_at.saturating_duration_since(now);
            // A zero expiration would disarm the timer; the caller's check avoids it.
            self.fd.get_ref().0.set(
                Expiration::OneShot(TimeSpec::from_duration(wait.max(Duration::from_nanos(1)))),
                TimerSetTimeFlags::empty(),
            )?;
            self.armed = Some(fire_at);
        }
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|inner| inner.get_ref().0.wait().map_err(std::io::Error::from)) {
                Ok(result) => {
                    self.armed = None;
                    return result;
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// Spins until `deadline`, charging the process's budget. A lead is only taken
/// while the budget has [`MAX_LEAD`] left, so the spin is bounded by it even
/// when several links' timers drew on the budget at once.
fn spin_until(deadline: Instant) {
    let now = Instant::now();
    let left = deadline.saturating_duration_since(now);
    if left.is_zero() {
        return;
    }
    SPIN_BUDGET.charge(left, now);
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// A running estimate of one quantile of the timerfd's wake-up latency
/// (stochastic quantile tracking: up by `q` steps on a sample above it, down by
/// `1 − q` below), so a change of machine load moves it within tens of sleeps.
#[derive(Debug, Clone, Copy)]
struct LatencyEstimate {
    ns: f64,
}

impl LatencyEstimate {
    /// What the VMs this was measured on showed (100–200 µs): a start close to
    /// it, so the first sleeps are not the lesson.
    const INITIAL: LatencyEstimate = LatencyEstimate { ns: 120_000.0 };

    fn lead(&self) -> Duration {
        if SPIN_BUDGET.exhausted() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.ns as u64).min(MAX_LEAD)
    }

    fn observe(&mut self, latency: Duration) {
        let sample = latency.as_nanos() as f64;
        if sample > self.ns {
            self.ns += ESTIMATE_STEP_NS * LEAD_QUANTILE;
        } else {
            self.ns -= ESTIMATE_STEP_NS * (1.0 - LEAD_QUANTILE);
        }
        self.ns = self.ns.clamp(0.0, MAX_LEAD.as_nanos() as f64);
    }
}

/// A token bucket of spinning time shared by every timer of the process.
struct SpinBudget {
    state: Mutex<Option<(Instant, Duration)>>,
}

static SPIN_BUDGET: SpinBudget = SpinBudget {
    state: Mutex::new(None),
};

impl SpinBudget {
    fn refill(state: &mut Option<(Instant, Duration)>, now: Instant) -> Duration {
        let (since, tokens) = state.unwrap_or((now, SPIN_BUDGET_PER_SECOND));
        let earned =
            SPIN_BUDGET_PER_SECOND.mul_f64(now.saturating_duration_since(since).as_secs_f64());
        let tokens = (tokens + earned).min(SPIN_BUDGET_PER_SECOND);
        *state = Some((now, tokens));
        tokens
    }

    fn charge(&self, spin: Duration, now: Instant) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let tokens = Self::refill(&mut state, now);
        *state = Some((now, tokens.saturating_sub(spin)));
    }

    fn exhausted(&self) -> bool {
        self.exhausted_at(Instant::now())
    }

    fn exhausted_at(&self, now: Instant) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return true;
        };
        Self::refill(&mut state, now) < MAX_LEAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_close_to_the_deadline() {
        let mut timer = PreciseTimer::new().expect("timerfd");
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let deadline = Instant::now() + Duration::from_micros(300);
            timer.sleep_until(deadline).await.expect("sleep");
            let late = Instant::now().saturating_duration_since(deadline);
            assert!(Instant::now() >= deadline, "woke early");
            worst = worst.max(late);
        }
        // tokio::time would be up to 1 ms late; allow slack for a busy CI machine.
        assert!(worst < Duration::from_millis(5), "woke {worst:?} late");
    }

    /// Median lateness of `n` sleeps of 2 ms, after 100 to learn.
    async fn median_lateness(timer: &mut PreciseTimer, precise: bool, n: usize) -> Duration {
        let mut late = Vec::new();
        for i in 0..100 + n {
            let deadline = Instant::now() + Duration::from_millis(2);
            if precise {
                timer.sleep_until_precisely(deadline).await.expect("sleep");
            } else {
                timer.sleep_until(deadline).await.expect("sleep");
            }
            let now = Instant::now();
            assert!(now >= deadline, "woke {:?} early", deadline - now);
            if i >= 100 {
                late.push(now - deadline);
            }
        }
        late.sort();
        late[late.len() / 2]
    }

    /// The promise of a precise sleep: whatever the machine's wake-up latency,
    /// the caller runs within a few microseconds of its deadline, never before.
    /// It fails with the lead taken out (`lead()` returning zero): then it is
    /// the machine's latency, 100–200 µs on the VMs this runs on.
    #[tokio::test]
    async fn a_precise_sleep_hides_the_wake_up_latency() {
        let mut timer = PreciseTimer::new().expect("timerfd");
        let plain = median_lateness(&mut timer, false, 30).await;
        let precise = median_lateness(&mut timer, true, 30).await;
        eprintln!("median lateness: plain {plain:?}, precise {precise:?}");
        assert!(
            precise <= Duration::from_micros(20),
            "a precise sleep was {precise:?} late (median); plain sleeps {plain:?}"
        );
    }

    #[test]
    fn the_estimate_settles_on_its_quantile() {
        let mut e = LatencyEstimate { ns: 0.0 };
        // Latencies 0..100 µs spread evenly: the 0.8 quantile is 80 µs.
        for round in 0..400 {
            for k in 0..100u64 {
                e.observe(Duration::from_micros((k * 37 + round) % 100));
            }
        }
        assert!((e.ns - 80_000.0).abs() < 5_000.0, "estimate {} ns", e.ns);
    }

    #[test]
    fn spinning_stops_at_the_budget() {
        let budget = SpinBudget {
            state: Mutex::new(None),
        };
        let t = Instant::now();
        assert!(!budget.exhausted_at(t));
        budget.charge(SPIN_BUDGET_PER_SECOND - MAX_LEAD / 2, t);
        assert!(budget.exhausted_at(t), "less than one lead is left");
        // Half a second later, half the budget is back.
        assert!(!budget.exhausted_at(t + Duration::from_millis(500)));
    }

    #[tokio::test]
    async fn past_deadlines_return_at_once() {
        let mut timer = PreciseTimer::new().expect("timerfd");
        let t = Instant::now();
        timer
            .sleep_until(t - Duration::from_millis(1))
            .await
            .expect("sleep");
        assert!(t.elapsed() < Duration::from_millis(5));
    }
}
