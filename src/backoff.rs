//! Exponential back-off for loops that wait for something to come back (a database, a
//! broker): the first wait, doubling up to a maximum, started over after a success.

use std::time::Duration;

/// A doubling delay with a ceiling.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            max: max.max(first),
        }
    }

    /// The delay to wait now; the one after it is twice as long (up to the maximum).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Sleeps for the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Starts over from the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_starts_over() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let waits: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(waits, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(50));
    }
}
