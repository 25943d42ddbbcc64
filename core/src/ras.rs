//! occl's side of RAS: the process's RAS thread (started by the first communicator, `OCCL_RAS_ENABLE=0` turns it
//! off) and the rank record each communicator rank keeps for it. Built without the `ras` feature, occl has no RAS
//! thread: `server` finds none, and the rank records are kept all the same.

use crate::config::Config;
use crate::error::Result;
#[cfg(feature = "ras")]
use occl_ras::server::RasConfig;
#[cfg(feature = "ras")]
pub(crate) use occl_ras::server::RasServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Without the `ras` feature there is no server: a type with no values, so every use of one is
/// code that cannot run.
#[cfg(not(feature = "ras"))]
pub(crate) enum RasServer {}

#[cfg(not(feature = "ras"))]
impl RasServer {
    pub(crate) fn mesh_addr(&self) -> std::net::SocketAddr {
        match *self {}
    }

    pub(crate) fn join(
        &self,
        _record: &std::sync::Arc<occl_ras_proto::record::CommRecord>,
        _peers: Vec<(u32, occl_ras_proto::mesh::PeerAddr)>,
    ) {
        match *self {}
    }

    fn leave(&self, _grace: Duration) {
        match *self {}
    }
}

static SERVER: OnceLock<Option<RasServer>> = OnceLock::new();
/// Communicator ranks of this process that joined RAS and are not destroyed yet.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A communicator rank joined RAS.
pub(crate) fn joined() {
    LIVE.fetch_add(1, Ordering::SeqCst);
}

/// A communicator rank that joined is gone; after the last one the process leaves the mesh with a goodbye, so its
/// peers record that it left instead of losing it (a job's normal end is not a failure).
pub(crate) fn left() {
    if LIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
        if let Some(Some(s)) = SERVER.get() {
            s.leave(Duration::from_millis(300));
        }
    }
}

/// The RAS thread of this process, started on first use with the first communicator's job secret (the
/// communicators of one job share their first, world communicator). `None` when RAS is off or could not start
/// (said once in the log); collectives never depend on it.
#[cfg(not(feature = "ras"))]
pub(crate) fn server(_config: &Config, _secret: &[u8; 16]) -> Result<Option<&'static RasServer>> {
    Ok(SERVER
        .get_or_init(|| {
            tracing::debug!("occl: built without the ras feature: this process is not visible to ncclras");
            None
        })
        .as_ref())
}

/// At exit: unless a communicator of this process failed, the job ended here; the client port's owner waits,
/// bounded, for Prometheus to scrape that once more, so that the alert rules read a normal end, not a crash
/// (occl-ras's `ending`). It logs nothing: the main thread's thread-locals, which a `tracing` subscriber writes
/// through, are gone by the time `exit` runs this, and touching them there aborts the process.
#[cfg(feature = "ras")]
extern "C" fn wait_for_last_scrape() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Some(s)) = SERVER.get() {
            s.exit_wait();
        }
    });
}

#[cfg(feature = "ras")]
pub(crate) fn server(config: &Config, secret: &[u8; 16]) -> Result<Option<&'static RasServer>> {
    use crate::error::Error;
    if let Some(s) = SERVER.get() {
        return Ok(s.as_ref());
    }
    // The mesh binds the rank's address, which init has chosen by now.
    let mesh_ip = config.listen_addr.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let cfg = RasConfig::from_vars(|k| std::env::var(k).ok(), mesh_ip).map_err(|e| Error::arg(e.to_string()))?;
    let s = SERVER.get_or_init(|| {
        if !cfg.enabled {
            tracing::debug!("occl: RAS is off (OCCL_RAS_ENABLE=0)");
            return None;
        }
        match RasServer::start(cfg, *secret) {
            Ok(s) => {
                // `/metrics` on the client port serves this process's telemetry (with every other process's of
                // the node); occl-ras knows nothing of occl-telemetry, so it gets a renderer.
                s.set_metrics_provider(std::sync::Arc::new(|out: &mut String| {
                    if let Some(t) = occl_telemetry::exporters::global() {
                        t.render_metrics(out);
                    }
                }));
                // `/api/v1/flight-recorder`: every live recorder of this process, read on request.
                occl_ras::server::set_flight_provider(std::sync::Arc::new(|out: &mut String| {
                    use std::fmt::Write as _;
                    let _ = write!(out, "{{\"pid\":{},\"records\":[", std::process::id());
                    for (i, r) in occl_telemetry::flight::live_recorders().iter().enumerate() {
                        let _ = write!(out, "{}{}", if i == 0 { "" } else { "," }, r.to_json("http"));
                    }
                    out.push_str("]}");
                }));
                // SAFETY: registers a plain `extern "C" fn` that takes no arguments and does not unwind.
                if unsafe { libc::atexit(wait_for_last_scrape) } != 0 {
                    tracing::debug!("occl: cannot register the RAS exit handler; a normal end may read as a crash");
                }
                tracing::debug!(
                    "occl: RAS mesh on {}, client port {}",
                    s.mesh_addr(),
                    s.client_addr().map_or("none".into(), |a| a.to_string())
                );
                Some(s)
            }
            Err(e) => {
                tracing::warn!("occl: RAS could not start ({e}); this process is not visible to ncclras");
                None
            }
        }
    });
    Ok(s.as_ref())
}
