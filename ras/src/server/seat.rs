//! Each client connection's seat in the port's admission table (`admission`), held by the task that serves it: the
//! seat says what the connection is doing, so that an idle one can be pushed out for a newcomer and a busy one
//! cannot, and gives its place up when the task ends or is aborted (eviction aborts the task, which drops the
//! seat). Since nobody evicts a busy connection, a write to a client is bounded in time too ([`write_within`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::task::AbortHandle;

use super::admission::{Admission, Admit, Limits, Slot};

/// The longest a report, a monitor event or a reply may take to write: a client that stops reading does not hold
/// its connection (a busy one, which nobody evicts) for ever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often, at most, a full client table is reported in the log.
pub(crate) const PRESSURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The client connections of this process: the admission table, and how to close each connection it evicts.
struct Table {
    adm: Admission,
    tasks: HashMap<Slot, AbortHandle>,
    /// Connections evicted and refused since the last log line, and when that was.
    evicted: u64,
    refused: u64,
    logged: Option<Instant>,
}

type TableRef = Arc<Mutex<Table>>;

fn lock(t: &TableRef) -> MutexGuard<'_, Table> {
    // Bookkeeping only; a panic while it was held leaves nothing half-done that matters.
    t.lock().unwrap_or_else(|p| p.into_inner())
}

impl Table {
    /// Says, at most once a minute, that clients are being pushed out or refused: the port is under a flood, or the
    /// bound is too small for the clients this node has.
    fn note_pressure(&mut self, evicted: bool) {
        if evicted {
            self.evicted += 1;
        } else {
            self.refused += 1;
        }
        if self.logged.is_some_and(|t| t.elapsed() < PRESSURE_LOG_EVERY) {
            return;
        }
        tracing::warn!(
            "occl-ras: the client port holds its maximum of {} connections: {} idle ones closed to let new clients \
             in, {} refused (every slot busy) since the last report; a client must send a complete request within \
             a few seconds of connecting",
            self.adm.len(),
            self.evicted,
            self.refused
        );
        self.logged = Some(Instant::now());
        self.evicted = 0;
        self.refused = 0;
    }
}

/// A connection's place in the table, held by its task: it says what the connection is doing, and gives the place
/// up when the task ends or is aborted (eviction aborts the task, which drops this).
#[derive(Clone)]
pub(crate) struct Seat(Arc<SeatInner>);

struct SeatInner {
    table: TableRef,
    slot: Slot,
    epoch: Instant,
}

impl Seat {
    fn now_ms(&self) -> u64 {
        self.0.epoch.elapsed().as_millis() as u64
    }

    /// A request is being served: the connection is not evicted meanwhile.
    pub(crate) fn busy(&self) {
        lock(&self.0.table).adm.busy(self.0.slot);
    }

    /// A request was completed; the connection waits for the next one.
    pub(crate) fn waiting(&self) {
        let now = self.now_ms();
        lock(&self.0.table).adm.waiting(now, self.0.slot);
    }

    /// The connection becomes a long-lived stream; `false` when too many are open already.
    pub(crate) fn stream(&self) -> bool {
        lock(&self.0.table).adm.stream(self.0.slot)
    }
}

impl Drop for SeatInner {
    fn drop(&mut self) {
        let mut t = lock(&self.table);
        t.adm.release(self.slot);
        t.tasks.remove(&self.slot);
    }
}

/// What the accept loop holds: the table, and the clock the admission table reads (its ms since the loop began).
pub(crate) struct Seats {
    table: TableRef,
    epoch: Instant,
}

impl Seats {
    /// A table of at most `max_clients` connections (see `Limits::for_total`).
    pub(crate) fn new(max_clients: usize) -> Seats {
        let table = Arc::new(Mutex::new(Table {
            adm: Admission::new(Limits::for_total(max_clients)),
            tasks: HashMap::new(),
            evicted: 0,
            refused: 0,
            logged: None,
        }));
        Seats { table, epoch: Instant::now() }
    }

    /// Admits a connection from `ip` and spawns `serve` with its seat, pushing out an idle connection (aborting its
    /// task) if the table is full. When every place is busy the connection is refused: `serve` is dropped unrun, and
    /// with it the connection it holds.
    pub(crate) fn admit<F>(&self, ip: IpAddr, serve: impl FnOnce(Seat) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let now = self.epoch.elapsed().as_millis() as u64;
        let (slot, evicted) = {
            let mut t = lock(&self.table);
            match t.adm.admit(now, ip) {
                Admit::Yes { slot, evict: None } => (slot, None),
                Admit::Yes { slot, evict: Some(v) } => {
                    t.note_pressure(true);
                    (slot, t.tasks.remove(&v))
                }
                Admit::No => {
                    t.note_pressure(false);
                    return;
                }
            }
        };
        // Aborted outside the lock: the task's end gives its place back, which takes the lock.
        if let Some(task) = evicted {
            task.abort();
        }
        let seat = Seat(Arc::new(SeatInner { table: self.table.clone(), slot, epoch: self.epoch }));
        let task = tokio::spawn(serve(seat));
        let mut t = lock(&self.table);
        // On this current-thread runtime the task cannot have run (and given its place back) yet; the check
        // keeps the table right on any runtime.
        if t.adm.contains(slot) {
            t.tasks.insert(slot, task.abort_handle());
        }
    }
}

/// Writes `bytes` within [`WRITE_TIMEOUT`]; `false` if the client is gone or stopped reading.
pub(crate) async fn write_within(stream: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> bool {
    matches!(tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await, Ok(Ok(())))
}
