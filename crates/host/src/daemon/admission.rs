//! Admission: which connections may be handshaking, and when a connection takes a guest's
//! place.
//!
//! A connection is *pending* from its accept until its hello (and, on TCP, its token) has
//! been read; only then does it count against the guest limit (`--max-guests`,
//! [`DaemonConfig::max_connections`](super::DaemonConfig::max_connections)). Pending
//! connections are held to budgets of their own, per listener ([`PENDING_PER_LISTENER`]) and
//! per peer ([`PENDING_PER_PEER`]: a Unix peer is its uid from `SO_PEERCRED`, a TCP peer its
//! address), so they never hold a guest's place and a TCP stranger never holds a local one.
//! When a budget is full, the oldest pending connection under it is cut off to make room
//! (its thread is woken, answers a refusal with the reason, and closes): a peer that keeps
//! reopening idle connections only ever cuts off its own, older ones. A connection whose
//! complete hello is already waiting in its socket is about to be served and is never cut
//! off (a guest writes its hello right after its connect); when every candidate is such a
//! connection the newcomer is refused instead.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtsoc_sync::LockExt;

/// Most connections of one listener pending their handshake at once.
pub const PENDING_PER_LISTENER: usize = 32;
/// Most connections of one peer pending their handshake at once.
pub const PENDING_PER_PEER: usize = 8;

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The Unix socket (process guests).
    Unix,
    /// The TCP listener (remote guests).
    Tcp,
}

/// Who is on the other end, as far as the budgets care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A local process, by user id.
    Uid(u32),
    /// A remote host, by address.
    Addr(std::net::IpAddr),
    /// Unknown (the credentials could not be read): one peer of its own per listener.
    Unknown,
}

/// What to do with a new connection ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Take it, after cutting off the pending connections at these positions.
    Admit(Vec<usize>),
    /// Refuse it: every connection it could displace has its hello waiting.
    Refuse,
}

/// One pending connection as [`plan`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its listener.
    pub listener: Listener,
    /// Its peer.
    pub peer: Peer,
    /// Its complete hello waits in its socket: it is about to be served.
    pub hello_waiting: bool,
}

/// The rule, on the pending connections oldest first: a newcomer of `(listener, peer)`
/// displaces the oldest connection of its peer without a hello waiting when the peer's
/// budget is full, then the oldest of its listener when the listener's is.
pub fn plan(
    pending: &[Seen],
    listener: Listener,
    peer: Peer,
    per_listener: usize,
    per_peer: usize,
) -> Plan {
    let mut evict: Vec<usize> = Vec::new();
    let of_peer = |e: &Seen| e.listener == listener && e.peer == peer;
    let cut_oldest = |evict: &mut Vec<usize>, wanted: &dyn Fn(&Seen) -> bool| {
        let victim = pending
            .iter()
            .enumerate()
            .position(|(i, e)| wanted(e) && !e.hello_waiting && !evict.contains(&i));
        match victim {
            Some(i) => {
                evict.push(i);
                true
            }
            None => false,
        }
    };
    if pending.iter().filter(|e| of_peer(e)).count() >= per_peer
        && !cut_oldest(&mut evict, &of_peer)
    {
        return Plan::Refuse;
    }
    let on_listener = pending
        .iter()
        .enumerate()
        .filter(|(i, e)| e.listener == listener && !evict.contains(i))
        .count();
    if on_listener >= per_listener && !cut_oldest(&mut evict, &|e: &Seen| e.listener == listener) {
        return Plan::Refuse;
    }
    Plan::Admit(evict)
}

/// Whether a complete hello frame (`u32` length, then that many bytes) waits in `fd`.
fn hello_waiting(fd: impl AsFd) -> bool {
    let Ok(n) = rustix::io::ioctl_fionread(&fd) else {
        return false;
    };
    if n < 4 {
        return false;
    }
    let mut len = [0u8; 4];
    match rustix::net::recv(
        &fd,
        &mut len,
        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
    ) {
        Ok((4, _)) => n >= 4 + u64::from(u32::from_le_bytes(len)),
        _ => false,
    }
}

/// One pending connection as the table keeps it.
struct Entry {
    id: u64,
    listener: Listener,
    peer: Peer,
    /// A duplicate of the connection's socket, to wake its thread when it is cut off.
    fd: OwnedFd,
    cut: Arc<AtomicBool>,
}

#[derive(Default)]
struct Table {
    entries: VecDeque<Entry>,
    next: u64,
}

/// The connections pending their handshake, with their budgets.
pub struct Pending {
    table: Mutex<Table>,
    per_listener: usize,
    per_peer: usize,
}

impl Default for Pending {
    fn default() -> Self {
        Pending::new(PENDING_PER_LISTENER, PENDING_PER_PEER)
    }
}

impl Pending {
    /// A table with these budgets (at least 1 each).
    pub fn new(per_listener: usize, per_peer: usize) -> Self {
        Pending {
            table: Mutex::new(Table::default()),
            per_listener: per_listener.max(1),
            per_peer: per_peer.max(1),
        }
    }

    /// Registers a new connection on `sock`, cutting off older pending connections as
    /// [`plan`] says; `None` when it is to be refused. The guard removes it when dropped
    /// (its handshake is over, one way or the other).
    pub fn enter(
        self: &Arc<Self>,
        sock: &impl AsFd,
        listener: Listener,
        peer: Peer,
    ) -> Option<PendingGuard> {
        let fd = sock.as_fd().try_clone_to_owned().ok()?;
        let mut t = self.table.lock_or_recover();
        let view: Vec<_> = t
            .entries
            .iter()
            .map(|e| Seen {
                listener: e.listener,
                peer: e.peer,
                hello_waiting: hello_waiting(&e.fd),
            })
            .collect();
        let Plan::Admit(mut evict) = plan(&view, listener, peer, self.per_listener, self.per_peer)
        else {
            return None;
        };
        evict.sort_unstable_by(|a, b| b.cmp(a));
        for i in evict {
            if let Some(e) = t.entries.remove(i) {
                e.cut.store(true, Ordering::SeqCst);
                // Wakes the thread waiting for the hello; it answers the refusal itself.
                let _ = rustix::net::shutdown(&e.fd, rustix::net::Shutdown::Read);
            }
        }
        let id = t.next;
        t.next += 1;
        let cut = Arc::new(AtomicBool::new(false));
        t.entries.push_back(Entry {
            id,
            listener,
            peer,
            fd,
            cut: cut.clone(),
        });
        Some(PendingGuard {
            table: self.clone(),
            id,
            cut,
        })
    }

    /// Connections pending now.
    pub fn len(&self) -> usize {
        self.table.lock_or_recover().entries.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The refusal a cut-off connection reads.
    pub fn cut_reason(&self) -> String {
        format!(
            "handshake cut off: more connections were waiting to complete their handshake \
             than the daemon keeps ({} per peer, {} per listener) and this one was the oldest",
            self.per_peer, self.per_listener
        )
    }
}

/// A connection's place among the pending ones, given up when dropped.
pub struct PendingGuard {
    table: Arc<Pending>,
    id: u64,
    cut: Arc<AtomicBool>,
}

/// How waiting for a hello ended ([`PendingGuard::await_hello`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// The complete hello waits in the socket, and the connection has left the pending
    /// ones: read it.
    Ready,
    /// The connection was cut off to make room for a newer one: refuse it with
    /// [`Pending::cut_reason`].
    Cut,
    /// The peer hung up.
    Closed,
    /// The deadline passed first.
    TimedOut,
}

/// Longest pause between two looks at a connection that holds part of its hello (the
/// kernel cannot wake a Unix socket's reader at a byte count); a complete hello written at
/// once, as guests write theirs, is seen as soon as it arrives.
const PARTIAL_RECHECK: Duration = Duration::from_millis(10);

impl PendingGuard {
    /// Whether the connection was cut off to make room for a newer one.
    pub fn was_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Waits until the complete hello frame waits in `sock` (nothing is read), then leaves
    /// the pending connections, atomically with the cut-off decisions: a connection whose
    /// hello is complete is never cut off, so once this answers [`Awaited::Ready`] nothing
    /// can shut its socket any more.
    pub fn await_hello(self, sock: &impl AsFd, deadline: Instant) -> Awaited {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Awaited::TimedOut;
            }
            let (readable, eof) = readable(sock, left);
            if self.cut.load(Ordering::SeqCst) {
                return Awaited::Cut;
            }
            if eof {
                return Awaited::Closed;
            }
            if readable {
                let fd = sock.as_fd();
                let mut t = self.table.table.lock_or_recover();
                if self.cut.load(Ordering::SeqCst) {
                    return Awaited::Cut;
                }
                if hello_waiting(fd) {
                    if let Some(i) = t.entries.iter().position(|e| e.id == self.id) {
                        t.entries.remove(i);
                    }
                    return Awaited::Ready;
                }
                drop(t);
                // Part of a hello: look again shortly (bounded by the deadline).
                std::thread::sleep(PARTIAL_RECHECK.min(left));
            }
        }
    }
}

/// Waits up to `left` for `sock` to become readable: (readable, at end of stream).
fn readable(sock: &impl AsFd, left: Duration) -> (bool, bool) {
    let timeout = rustix::time::Timespec {
        tv_sec: left.as_secs() as i64,
        tv_nsec: left.subsec_nanos() as _,
    };
    let mut fds = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::IN,
    )];
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(n) if n > 0 => {
            let mut b = [0u8; 1];
            let peek = rustix::net::recv(
                sock,
                &mut b,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            );
            (
                true,
                matches!(peek, Ok((0, _)) | Err(_))
                    && !matches!(peek, Err(rustix::io::Errno::AGAIN)),
            )
        }
        _ => (false, false),
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut t = self.table.table.lock_or_recover();
        if let Some(i) = t.entries.iter().position(|e| e.id == self.id) {
            t.entries.remove(i);
        }
    }
}

/// The peer of a Unix connection: its uid.
pub fn unix_peer(sock: &impl AsFd) -> Peer {
    match rustix::net::sockopt::socket_peercred(sock) {
        Ok(c) => Peer::Uid(c.uid.as_raw()),
        Err(_) => Peer::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{IpAddr, Ipv4Addr};
    use std::os::unix::net::UnixStream;
    use Listener::*;

    const LOCAL: Peer = Peer::Uid(0);
    const OTHER: Peer = Peer::Uid(1000);
    const STRANGER: Peer = Peer::Addr(IpAddr::V4(Ipv4Addr::LOCALHOST));

    fn idle(listener: Listener, peer: Peer) -> Seen {
        Seen {
            listener,
            peer,
            hello_waiting: false,
        }
    }

    fn ready(listener: Listener, peer: Peer) -> Seen {
        Seen {
            hello_waiting: true,
            ..idle(listener, peer)
        }
    }

    #[test]
    fn within_budget_nothing_is_cut() {
        let p = [idle(Unix, LOCAL), idle(Tcp, STRANGER)];
        assert_eq!(plan(&p, Unix, OTHER, 4, 2), Plan::Admit(vec![]));
    }

    #[test]
    fn a_full_peer_loses_its_oldest_idle_connection() {
        let p = [idle(Unix, OTHER), idle(Unix, LOCAL), idle(Unix, LOCAL)];
        assert_eq!(plan(&p, Unix, LOCAL, 8, 2), Plan::Admit(vec![1]));
    }

    #[test]
    fn a_full_listener_loses_its_oldest_idle_connection_whoever_it_is() {
        let p = [idle(Tcp, STRANGER), idle(Unix, OTHER), idle(Unix, LOCAL)];
        assert_eq!(plan(&p, Unix, LOCAL, 2, 8), Plan::Admit(vec![1]));
    }

    #[test]
    fn tcp_strangers_never_displace_local_guests() {
        let mut p: Vec<_> = (0..4).map(|_| idle(Unix, LOCAL)).collect();
        p.extend((0..4).map(|_| idle(Tcp, STRANGER)));
        match plan(&p, Tcp, STRANGER, 4, 4) {
            Plan::Admit(evict) => assert_eq!(evict, vec![4]),
            Plan::Refuse => panic!("refused"),
        }
    }

    #[test]
    fn a_connection_with_its_hello_waiting_is_never_cut() {
        let p = [ready(Unix, LOCAL), idle(Unix, LOCAL), ready(Unix, LOCAL)];
        assert_eq!(plan(&p, Unix, LOCAL, 8, 3), Plan::Admit(vec![1]));
        let p = [ready(Unix, LOCAL), ready(Unix, LOCAL)];
        assert_eq!(plan(&p, Unix, LOCAL, 8, 2), Plan::Refuse);
        assert_eq!(plan(&p, Unix, OTHER, 2, 8), Plan::Refuse);
    }

    #[test]
    fn a_full_peer_on_a_full_listener_loses_one_for_each_budget() {
        let p = [idle(Unix, OTHER), idle(Unix, LOCAL), idle(Unix, LOCAL)];
        // The peer's oldest (1) goes; the listener still holds 2 of 2, so its oldest (0) too.
        assert_eq!(plan(&p, Unix, LOCAL, 2, 2), Plan::Admit(vec![1, 0]));
    }

    #[test]
    fn the_table_cuts_off_idle_connections_and_forgets() {
        let pending = Arc::new(Pending::new(2, 8));
        let (a, _a) = UnixStream::pair().unwrap();
        let (b, mut b_peer) = UnixStream::pair().unwrap();
        let (c, _c) = UnixStream::pair().unwrap();
        let (d, _d) = UnixStream::pair().unwrap();
        let ga = pending.enter(&a, Unix, LOCAL).unwrap();
        let gb = pending.enter(&b, Unix, LOCAL).unwrap();
        // b's complete hello (a 2-byte frame) waits: only a may go.
        b_peer.write_all(&[2, 0, 0, 0, b'{', b'}']).unwrap();
        let gc = pending.enter(&c, Unix, LOCAL).unwrap();
        assert!(ga.was_cut() && !gb.was_cut() && !gc.was_cut());
        let soon = Instant::now() + std::time::Duration::from_secs(5);
        assert_eq!(ga.await_hello(&a, soon), Awaited::Cut);
        // The cut-off connection's reads end at once.
        let mut buf = [0u8; 4];
        assert_eq!(std::io::Read::read(&mut &a, &mut buf).unwrap(), 0);
        assert_eq!(pending.len(), 2);
        // c is idle: d displaces it.
        let gd = pending.enter(&d, Unix, LOCAL).unwrap();
        assert!(gc.was_cut() && !gb.was_cut());
        drop(gc);
        assert_eq!(pending.len(), 2);
        // b's hello is complete: it leaves the table, and can no longer be cut off.
        assert_eq!(gb.await_hello(&b, soon), Awaited::Ready);
        assert_eq!(pending.len(), 1);
        drop(gd);
        assert!(pending.is_empty());
    }
}
