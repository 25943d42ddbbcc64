//! occl's side of RAS: the process's RAS thread (started by the first communicator, `OCCL_RAS_ENABLE=0` turns it
//! off) and the rank record each communicator rank keeps for it.

use crate::config::Config;
use crate::error::{Error, Result};
use occl_ras::server::{RasConfig, RasServer};
use std::sync::OnceLock;

static SERVER: OnceLock<Option<RasServer>> = OnceLock::new();

/// The RAS thread of this process, started on first use with the first communicator's job secret (the
/// communicators of one job share their first, world communicator). `None` when RAS is off or could not start
/// (said once in the log); collectives never depend on it.
pub(crate) fn server(config: &Config, secret: &[u8; 16]) -> Result<Option<&'static RasServer>> {
    if let Some(s) = SERVER.get() {
        return Ok(s.as_ref());
    }
    let cfg =
        RasConfig::from_vars(|k| std::env::var(k).ok(), config.listen_addr).map_err(|e| Error::arg(e.to_string()))?;
    let s = SERVER.get_or_init(|| {
        if !cfg.enabled {
            tracing::debug!("occl: RAS is off (OCCL_RAS_ENABLE=0)");
            return None;
        }
        match RasServer::start(cfg, *secret) {
            Ok(s) => {
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
