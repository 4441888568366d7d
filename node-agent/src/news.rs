//! Wakes an idle agent's reporter when something it would report moves.
//!
//! An idle agent used to look at its counters a few times per idle interval
//! to find out whether a report was due; at thousands of agents on a machine
//! each look was a wake-up of every agent, and wake-ups were most of what idle
//! agents cost. Now the reporter arms this once it finds nothing new and
//! sleeps until the idle report is due or until a counter moves, whichever
//! comes first. Counting costs a relaxed load while nobody is waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// One per agent process: the reporter is the only waiter.
pub struct News {
    armed: AtomicBool,
    notify: Notify,
}

impl News {
    const fn new() -> Self {
        News {
            armed: AtomicBool::new(false),
            notify: Notify::const_new(),
        }
    }

    /// Something a report carries changed.
    #[inline]
    pub fn touch(&self) {
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    /// Called before the reporter reads the counters it compares, so that a
    /// change made while it reads them is not missed.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// The reporter is sending anyway: counting need not wake it.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
    }

    /// Resolves at the first [`touch`](Self::touch) since [`arm`](Self::arm)
    /// (at once if one came in between).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

/// The agent's news.
pub fn news() -> &'static News {
    static NEWS: News = News::new();
    &NEWS
}

/// Shorthand for `news().touch()`, for the places that count.
#[inline]
pub fn touch() {
    news().touch();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whether a wait that starts now ends within `within`.
    async fn wakes(news: &News, within: Duration) -> bool {
        tokio::time::timeout(within, news.changed()).await.is_ok()
    }

    #[tokio::test]
    async fn a_touch_wakes_the_armed_reporter_once_and_an_unarmed_one_never() {
        let news = News::new();
        let short = Duration::from_millis(50);
        news.touch();
        assert!(
            !wakes(&news, short).await,
            "a touch while nobody listened woke a later wait"
        );
        news.arm();
        news.touch();
        news.touch();
        assert!(
            wakes(&news, Duration::from_secs(1)).await,
            "the touch after arm wakes the wait, even made before it"
        );
        assert!(!wakes(&news, short).await, "two touches woke it twice");
        news.arm();
        news.disarm();
        news.touch();
        assert!(!wakes(&news, short).await, "a disarmed reporter was woken");
    }
}
