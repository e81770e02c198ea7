use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use super::*;

/// The server on a free port of 127.0.0.1, in a thread of its own that
/// runs until the test binary ends. Its address.
fn start(answer: Answer) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async { serve(TcpListener::from_std(listener).unwrap(), answer).await })
    });
    addr
}

fn ok(_: &Request<Incoming>) -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from_static(b"ok\n")))
}

/// More than any socket buffers hold.
const BIG: usize = 64 << 20;

fn big(_: &Request<Incoming>) -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from(vec![b'x'; BIG])))
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n";

/// Everything `s` reads until the server closes it, within `within`.
fn read_to_close(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => got,
        Err(e) => panic!("not closed within {within:?} ({} bytes): {e}", got.len()),
    }
}

/// Whether the server has closed `s` (what it sent read and dropped).
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_connection_answers_at_most_its_requests() {
    let addr = start(ok);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&GET.repeat(REQUESTS as usize + 50)).unwrap();
    let text = String::from_utf8(read_to_close(&mut s, Duration::from_secs(10))).unwrap();
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), REQUESTS as usize);
    let last = text.rsplit("HTTP/1.1 200 OK").next().unwrap();
    assert!(last.contains("connection: close"), "{last}");
}

#[test]
fn an_answer_left_unread_is_given_up_on() {
    let addr = start(big);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(GET).unwrap();
    std::thread::sleep(STALL + Duration::from_millis(500));
    // What the buffers held, and no more.
    let got = read_to_close(&mut s, Duration::from_secs(5));
    assert!(!got.is_empty() && got.len() < BIG, "{} bytes", got.len());
}

#[test]
fn a_connection_that_sends_nothing_is_closed() {
    let addr = start(ok);
    let mut s = TcpStream::connect(addr).unwrap();
    let start = std::time::Instant::now();
    assert!(read_to_close(&mut s, IDLE * 2).is_empty());
    assert!(start.elapsed() >= IDLE - Duration::from_millis(100));
}

/// A peer past its cap loses its connection idle the longest, at once;
/// a new one is served.
#[test]
fn a_peer_past_its_cap_loses_its_idlest_connection() {
    let addr = start(ok);
    let mut held: Vec<TcpStream> = (0..PER_PEER)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(10));
            s
        })
        .collect();
    // The first is active again: the second is the idlest.
    held[0].write_all(GET).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut new = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let gone: Vec<usize> = (0..PER_PEER).filter(|&i| closed(&mut held[i])).collect();
    assert_eq!(gone, [1]);
    new.write_all(GET).unwrap();
    let mut answer = [0u8; 15];
    new.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200 OK");
}

/// Active `since_ms` after `base`, and waiting on a write since then.
fn activity(base: Instant, since_ms: u64, blocked: bool) -> Activity {
    let at = base + Duration::from_millis(since_ms);
    Activity {
        active: at,
        requests: 1,
        blocked: blocked.then_some(at),
    }
}

#[test]
fn victims_are_stalled_answers_first_then_the_idlest() {
    let base = Instant::now();
    let activity = |ms, blocked| activity(base, ms, blocked);
    let now = base + Duration::from_secs(1);
    let victim = |conns: &[_], peer| victim(conns, peer, now);
    let local = peer("127.0.0.1".parse().unwrap());
    let remote: IpAddr = "192.0.2.1".parse().unwrap();
    // Room: no one goes.
    let few: Vec<_> = (0..PER_PEER as u64 - 1)
        .map(|i| (i, local, activity(i, false)))
        .collect();
    assert_eq!(victim(&few, local), None);
    // A full peer: its idlest, or a stalled answer before it, the one
    // whose request is oldest.
    let mut full = few.clone();
    full.push((99, local, activity(50, false)));
    assert_eq!(victim(&full, local), Some(0));
    assert_eq!(victim(&full, remote), None);
    full[5].2 = activity(40, true);
    full[7].2 = activity(30, true);
    assert_eq!(victim(&full, local), Some(7));
    // A write that has waited less than STALLED is a live transfer's: it
    // goes by its request, as the others.
    for (_, _, a) in &mut full {
        a.blocked = a.blocked.map(|_| now - STALLED / 2);
    }
    assert_eq!(victim(&full, local), Some(0));
    // All full: a connection of the peer that holds the most, even for
    // another peer.
    let mut all: Vec<_> = (0..CONNECTIONS as u64)
        .map(|i| {
            let p = IpAddr::from([192, 0, 2, (i % 8) as u8]);
            (i, p, activity(100 + i, false))
        })
        .collect();
    all[63].1 = IpAddr::from([192, 0, 2, 0]);
    // 192.0.2.0 holds nine, its idlest first.
    assert_eq!(victim(&all, remote), Some(0));
    all[8].2 = activity(0, true);
    assert_eq!(victim(&all, remote), Some(8));
    all[3].2 = activity(0, true);
    assert_eq!(victim(&all, remote), Some(8), "192.0.2.3 holds eight");
}

#[test]
fn peers_are_addresses_with_loopback_one_and_ipv6_by_64() {
    let p = |s: &str| peer(s.parse().unwrap());
    assert_eq!(p("127.0.0.1"), p("127.3.2.1"));
    assert_eq!(p("::1"), p("127.0.0.1"));
    assert_eq!(p("::ffff:192.0.2.7"), p("192.0.2.7"));
    assert_ne!(p("192.0.2.7"), p("192.0.2.8"));
    assert_eq!(p("2001:db8::1"), p("2001:db8::ffff:1"));
    assert_ne!(p("2001:db8::1"), p("2001:db8:0:1::1"));
}
