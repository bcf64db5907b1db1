//! One client connection below hyper: its timeouts and how it closes.
//!
//! hyper's own header-read timeout starts as soon as a response is written, so it doubles
//! as the idle keep-alive timeout. Here the two are apart: `ConnIo` gives a request head
//! `header_timeout` from its first byte, and an idle connection (no request in flight, no
//! byte of the next one) `idle_timeout`. It also closes the way a client can rely on:
//! when a handler answered early and could not drain the request body (too large, too
//! slow), the response says `Connection: close` and the close *lingers* as nginx's does:
//! after the answer and a FIN, the rest of what the client sends is read and discarded (up
//! to a few body limits, for a few seconds) before the socket is closed. Closing at once
//! with unread data makes the kernel send a reset, and the client loses the answer.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long a lingering close keeps reading what the client still sends.
const LINGER_TIME: Duration = Duration::from_secs(5);

/// How much a lingering close reads, at most, in body limits.
const LINGER_BODY_LIMITS: usize = 4;

/// What the request side knows of a connection: requests in flight, and whether its close
/// must linger. Shared by the service (which dispatches requests) and `ConnIo`.
pub struct ConnState {
    /// Requests handed to the service and not answered yet.
    in_flight: AtomicU32,
    /// Requests dispatched so far: a head that started before the last dispatch is done.
    dispatched: AtomicU64,
    /// When the connection last became idle, in milliseconds since `epoch`.
    idle_since_ms: AtomicU64,
    linger: AtomicBool,
    epoch: Instant,
    /// The address the client connected to (which `Host` may name) and the client's own
    /// (sign-in attempts are limited per client address).
    pub local: Option<IpAddr>,
    pub peer: Option<IpAddr>,
}

impl Default for ConnState {
    fn default() -> Self {
        ConnState::at(None, None)
    }
}

impl ConnState {
    /// A connection from `peer` to `local`.
    pub fn at(local: Option<IpAddr>, peer: Option<IpAddr>) -> ConnState {
        ConnState {
            in_flight: AtomicU32::new(0),
            dispatched: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            linger: AtomicBool::new(false),
            epoch: Instant::now(),
            local,
            peer,
        }
    }
}

/// A request being answered; dropping it marks the connection idle again.
pub struct InFlight<'a>(&'a ConnState);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let s = self.0;
        s.idle_since_ms
            .store(s.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        s.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnState {
    /// A request head was read and handed to the service.
    pub fn begin(&self) -> InFlight<'_> {
        self.dispatched.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self)
    }

    /// The response says `Connection: close` with part of the request unread: the close
    /// must linger so the client can read the answer.
    pub fn linger(&self) {
        self.linger.store(true, Ordering::Relaxed);
    }

    fn idle_since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed))
    }
}

/// The timeouts of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From the first byte of a request head to the whole head.
    pub header: Duration,
    /// With no request in flight and nothing of the next one yet.
    pub idle: Duration,
    /// The request body limit (a lingering close reads a few of them at most).
    pub body_limit: usize,
}

/// A client's TCP stream with the timeouts and the lingering close described above.
pub struct ConnIo {
    stream: TcpStream,
    state: Arc<ConnState>,
    timeouts: Timeouts,
    /// When the first byte of the current request head arrived, and how many requests
    /// had been dispatched then.
    head_since: Option<(Instant, u64)>,
    timer: Option<Pin<Box<Sleep>>>,
    lingering: Option<Lingering>,
}

struct Lingering {
    until: Pin<Box<Sleep>>,
    left: usize,
    shut: bool,
}

impl ConnIo {
    pub fn new(stream: TcpStream, state: Arc<ConnState>, timeouts: Timeouts) -> ConnIo {
        ConnIo {
            stream,
            state,
            timeouts,
            head_since: None,
            timer: None,
            lingering: None,
        }
    }

    /// The deadline that applies while waiting for bytes, if any: none while a request is
    /// being answered (its handler bounds its own body reads).
    fn deadline(&mut self) -> Option<(Instant, bool)> {
        let s = &self.state;
        if s.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let dispatched = s.dispatched.load(Ordering::Relaxed);
        match self.head_since {
            Some((at, n)) if n == dispatched => Some((at + self.timeouts.header, true)),
            _ => {
                self.head_since = None;
                Some((s.idle_since() + self.timeouts.idle, false))
            }
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let s = &this.state;
                if buf.filled().len() > before && s.in_flight.load(Ordering::Acquire) == 0 {
                    let dispatched = s.dispatched.load(Ordering::Relaxed);
                    if this.head_since.is_none_or(|(_, n)| n != dispatched) {
                        this.head_since = Some((Instant::now(), dispatched));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let Some((deadline, in_head)) = this.deadline() else {
                    return Poll::Pending;
                };
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if in_head {
                    // A request head that never finished (a slow client): an error closes
                    // the connection without an answer, as for any malformed head.
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request head not received in time",
                    )))
                } else {
                    // Idle for too long: as if the client had closed (a quiet close).
                    Poll::Ready(Ok(()))
                }
            }
        }
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.state.linger.load(Ordering::Relaxed) {
            return Pin::new(&mut this.stream).poll_shutdown(cx);
        }
        let l = this.lingering.get_or_insert_with(|| Lingering {
            until: Box::pin(tokio::time::sleep(LINGER_TIME)),
            left: this.timeouts.body_limit.saturating_mul(LINGER_BODY_LIMITS),
            shut: false,
        });
        if !l.shut {
            // The answer is out; the FIN tells the client nothing more comes.
            ready!(Pin::new(&mut this.stream).poll_shutdown(cx))?;
            l.shut = true;
        }
        let mut scratch = [0u8; 8192];
        loop {
            if l.left == 0 || l.until.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.stream).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => l.left = l.left.saturating_sub(rb.filled().len()),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
