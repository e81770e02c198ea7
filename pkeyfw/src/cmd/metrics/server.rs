//! The HTTP server of `pkeyfw metrics` (HTTP/1.1, hyper), made so that no
//! client can wedge it (issue 36 §4). Thirty-two local connections that
//! pipelined requests and never read the answers once held every slot of
//! the old server, whose accept loop then waited for one to free: scrapes
//! timed out and `PkeyfwMetricsDown` fired while the filter was fine.
//!
//! The limits, as nginx and Envoy set theirs:
//!
//! - **An answer the client does not read is given up on**: a write that
//!   waits for the client for [`STALL`], or an answer not written whole
//!   [`ANSWER`] after its request, closes the connection (nginx's
//!   `send_timeout`).
//! - **Waiting is bounded**: a request's head must arrive within [`IDLE`]
//!   of the connection's being ready for it, which bounds a new connection
//!   that sends nothing, a head sent a byte at a time and a kept-alive
//!   connection's idling alike (`client_header_timeout`,
//!   `keepalive_timeout`).
//! - **Keep-alive is bounded**: the [`REQUESTS`]th answer of a connection
//!   says `Connection: close` (`keepalive_requests`), and a connection
//!   older than [`LIFETIME`] is closed once its answer in progress, if
//!   any, is written (Envoy's `max_connection_duration`).
//! - **Accepting never stops**, and a new connection is always served:
//!   past [`PER_PEER`] connections from its peer, or [`CONNECTIONS`] in
//!   all (then from the peers that hold the most), the connection least
//!   worth keeping is closed to make room, as nginx reclaims idle
//!   keep-alive connections when it runs out: first one whose answer has
//!   waited [`STALLED`] for its client to read (the one whose request is
//!   oldest), then the one that has gone longest without a request.
//!   Nothing queues.
//!
//! Every loopback address is one peer, since any local user may connect
//! from any address of 127.0.0.0/8, and so is an IPv6 /64: the peer cap
//! keeps one host from taking the whole budget, not one local user from
//! crowding out another. What keeps a local scraper served beside a local
//! flood is the order of closing: a scraper's connection sends its request
//! at once and reads its answer at once, so it is the newest in activity
//! and never waits long on a write, while a flood's connections are
//! stalled or idle. A new connection is read before the next is accepted.
//!
//! The values: an answer here is a read at most a second old, some
//! kilobytes an attachment, which a scraper reads in milliseconds
//! (Prometheus gives a scrape 10 s by default): 2 s without progress and
//! 5 s in all leave a remote scraper on a slow link room while freeing a
//! stalled slot fast. Prometheus scrapes every 15 s or more as a rule, so
//! keeping an idle connection longer than 5 s saves it little; a scraper
//! makes one request a scrape, so 100 a connection and 60 s cost it one
//! new connection a minute at most. A scraper needs one connection, an
//! HA pair two: 16 an address and 64 in all leave room for many scrapers
//! and keep descriptors and buffers bounded.

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::{IpAddr, Ipv6Addr},
    pin::{Pin, pin},
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Request, Response,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    task::AbortHandle,
    time::{Instant, Sleep},
};

/// Connections served at once, from every peer together.
const CONNECTIONS: usize = 64;
/// Connections served at once from one peer (every loopback address
/// counting as one, and an IPv6 /64 as one).
const PER_PEER: usize = 16;
/// How long a connection may wait for a request's head: a new one for its
/// first, a kept-alive one for its next.
const IDLE: Duration = Duration::from_secs(5);
/// How long one write of an answer may wait for the client to read.
const STALL: Duration = Duration::from_secs(2);
/// A write of an answer waiting this long for the client to read puts its
/// connection first in line to be closed for room: shorter waits are a
/// live transfer's.
const STALLED: Duration = Duration::from_millis(500);
/// How long an answer may take to be written whole, from its request.
const ANSWER: Duration = Duration::from_secs(5);
/// Requests served on one connection.
const REQUESTS: u32 = 100;
/// How long a connection is kept.
const LIFETIME: Duration = Duration::from_secs(60);

/// The answer to a request.
pub type Answer = fn(&Request<Incoming>) -> Response<Full<Bytes>>;

/// Serves `listener` with `answer` under the limits above; never returns.
pub async fn serve(listener: TcpListener, answer: Answer) -> ! {
    let table = Arc::new(Mutex::new(Table::default()));
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors, say: wait, do not end the service.
            Err(e) => {
                eprintln!("pkeyfw: accepting a metrics client: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = peer(addr.ip());
        let activity = Arc::new(Mutex::new(Activity {
            active: Instant::now(),
            requests: 0,
            blocked: None,
        }));
        let evicted = {
            let mut t = lock(&table);
            let evicted = t.make_room(peer);
            let id = t.next;
            t.next += 1;
            let leave = Leave {
                table: table.clone(),
                id,
            };
            let task = tokio::spawn(connection(stream, activity.clone(), answer, leave));
            t.conns.insert(
                id,
                Conn {
                    peer,
                    activity,
                    task: task.abort_handle(),
                },
            );
            evicted
        };
        if let Some(task) = evicted {
            // Its stream is closed as its task is dropped.
            task.abort();
        }
        // The new connection reads its request before the next one is
        // accepted, so that a flood of connections cannot close it first.
        tokio::task::yield_now().await;
    }
}

/// Whom a connection counts against: its address, every loopback address
/// being one (any local user may connect from any of 127.0.0.0/8) and an
/// IPv6 /64 one (a host's usual share).
fn peer(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        ip if ip.is_loopback() => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// What a connection is doing, as its task notes it: what decides which
/// connection is closed to make room.
#[derive(Clone, Copy)]
struct Activity {
    /// When it made its last request (or was accepted, before any): its
    /// answer is due by then and [`ANSWER`].
    active: Instant,
    /// Requests it has made.
    requests: u32,
    /// Since when a write of its answer has waited for the client to read.
    blocked: Option<Instant>,
}

impl Activity {
    /// The lowest is closed first: an answer left unread for [`STALLED`]
    /// before anything else, the one whose request is oldest; then the
    /// connection that has gone longest without a request.
    fn keep(&self, now: Instant) -> (bool, Instant) {
        let stalled = self
            .blocked
            .is_some_and(|b| now.saturating_duration_since(b) >= STALLED);
        (!stalled, self.active)
    }
}

/// A connection served.
struct Conn {
    peer: IpAddr,
    activity: Arc<Mutex<Activity>>,
    task: AbortHandle,
}

/// The connections served.
#[derive(Default)]
struct Table {
    conns: HashMap<u64, Conn>,
    /// The next connection's number.
    next: u64,
}

impl Table {
    /// Makes room for a new connection from `peer`: takes out the
    /// connection to close for it, if one must go.
    fn make_room(&mut self, peer: IpAddr) -> Option<AbortHandle> {
        let conns: Vec<(u64, IpAddr, Activity)> = self
            .conns
            .iter()
            .map(|(&id, c)| (id, c.peer, *lock(&c.activity)))
            .collect();
        let id = victim(&conns, peer, Instant::now())?;
        self.conns.remove(&id).map(|c| c.task)
    }
}

/// Which of `conns` to close for a new connection from `peer`: none while
/// its peer holds fewer than [`PER_PEER`] and all fewer than
/// [`CONNECTIONS`]; else the one least worth keeping of its peer's, or
/// (all being full) of those of the peers that hold the most.
fn victim(conns: &[(u64, IpAddr, Activity)], peer: IpAddr, now: Instant) -> Option<u64> {
    let mut held: HashMap<IpAddr, usize> = HashMap::new();
    for (_, p, _) in conns {
        *held.entry(*p).or_default() += 1;
    }
    let peer_full = held.get(&peer).is_some_and(|&n| n >= PER_PEER);
    if !peer_full && conns.len() < CONNECTIONS {
        return None;
    }
    let most = held.values().copied().max().unwrap_or(0);
    conns
        .iter()
        .filter(|(_, p, _)| match peer_full {
            true => *p == peer,
            false => held[p] == most,
        })
        .min_by_key(|(_, _, a)| a.keep(now))
        .map(|&(id, ..)| id)
}

/// Takes a connection out of the table when its task ends, however it
/// ends (aborted too).
struct Leave {
    table: Arc<Mutex<Table>>,
    id: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        lock(&self.table).conns.remove(&self.id);
    }
}

/// Serves one connection until it closes, fails a limit or is closed to
/// make room.
async fn connection(
    stream: TcpStream,
    activity: Arc<Mutex<Activity>>,
    answer: Answer,
    _leave: Leave,
) {
    let io = TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
        due: Box::pin(tokio::time::sleep(LIFETIME)),
    });
    let service = service_fn(move |req| {
        let last = {
            let mut a = lock(&activity);
            a.active = Instant::now();
            a.requests += 1;
            a.requests >= REQUESTS
        };
        let mut response = answer(&req);
        if last {
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        async { Ok::<_, Infallible>(response) }
    });
    let mut conn = pin!(
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(IDLE)
            .serve_connection(io, service)
    );
    // A client that goes away mid-answer, or is cut off by a limit, is its
    // own business.
    if tokio::time::timeout(LIFETIME, conn.as_mut()).await.is_err() {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

/// A connection's stream, which notes when a write of an answer waits for
/// the client, and fails it past [`STALL`] or [`ANSWER`].
struct Watched {
    stream: TcpStream,
    activity: Arc<Mutex<Activity>>,
    /// Wakes the task when the waiting write is due.
    due: Pin<Box<Sleep>>,
}

impl Watched {
    /// What a write of the stream gave, once noted.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let mut a = lock(&self.activity);
        if written.is_ready() {
            a.blocked = None;
            return written;
        }
        let blocked = *a.blocked.get_or_insert_with(Instant::now);
        let due = (blocked + STALL).min(a.active + ANSWER);
        drop(a);
        if self.due.deadline() != due {
            self.due.as_mut().reset(due);
        }
        match self.due.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client does not read its answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// `m`'s content: none of these locks is held across a panic that leaves
/// it half-written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
