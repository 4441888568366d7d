//! A timer with sub-millisecond resolution. tokio's timer wheel rounds every
//! sleep up to the next millisecond, which would add up to a millisecond to each
//! emulated delay and bunch paced packets; a timerfd wakes within microseconds.

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

pub struct PreciseTimer {
    fd: AsyncFd<Fd>,
    /// The deadline the timerfd is armed for, until it is seen to fire: a
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

    /// Resolves at `deadline` (immediately if it has passed).
    pub async fn sleep_until(&mut self, deadline: Instant) -> std::io::Result<()> {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Ok(());
        }
        if self.armed != Some(deadline) {
            // A zero expiration would disarm the timer; the check above avoids it.
            self.fd.get_ref().0.set(
                Expiration::OneShot(TimeSpec::from_duration(wait.max(Duration::from_nanos(1)))),
                TimerSetTimeFlags::empty(),
            )?;
            self.armed = Some(deadline);
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
