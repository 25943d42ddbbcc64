//! Whether this rank may use the ib (RDMA) transport. Every rank decides once at init, before
//! the bootstrap, and publishes the answer in its `PeerInfo`, so that `transport::select` gives
//! every rank the same choice for every pair. A forced `OCCL_TRANSPORT=ib` that cannot be
//! honoured fails init with `InvalidUsage` saying why, on every rank, before anyone waits.
//!
//! The protocol parts of the data path (connection records, QP state machine, credits,
//! registration cache) are in the `ibverbs` crate; they are not wired into the FIFOs yet, so a
//! usable device still leaves ib unselected (automatic) or refused (forced), with a log line or
//! error that says so.

use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};

/// The usable ports (`device:port`, comma-separated), or why there are none.
#[cfg(feature = "ib")]
fn find_ports(config: &Config) -> std::result::Result<String, String> {
    let filter = match &config.ib_hca {
        Some(v) => ibverbs::hca::HcaFilter::parse(v).map_err(|e| e.to_string())?,
        None => ibverbs::hca::HcaFilter::default(),
    };
    let ports = ibverbs::device::probe(&filter, config.ib_gid_index).map_err(|e| e.to_string())?;
    Ok(ports.iter().map(|p| format!("{}:{}", p.device, p.port)).collect::<Vec<_>>().join(", "))
}

#[cfg(not(feature = "ib"))]
fn find_ports(_: &Config) -> std::result::Result<String, String> {
    Err("occl was built without its `ib` feature (cargo build --features ib)".into())
}

/// The error for a forced `OCCL_TRANSPORT=ib`, given what the probe found.
fn forced_error(found: std::result::Result<String, String>) -> Error {
    match found {
        Err(why) => Error::usage(format!("OCCL_TRANSPORT=ib, but no RDMA device is usable: {why}")),
        Ok(ports) => Error::usage(format!(
            "OCCL_TRANSPORT=ib: RDMA port(s) {ports} are usable, but this build of occl has no ib data path \
             yet (only its connection and flow-control logic); use OCCL_TRANSPORT=tcp"
        )),
    }
}

/// Whether this rank offers ib to its peers. Errors only when ib is forced and cannot be used.
pub(crate) fn probe(config: &Config) -> Result<bool> {
    match config.transport {
        Some(TransportKind::Ib) => Err(forced_error(find_ports(config))),
        // A forced shm or tcp never touches the verbs library.
        Some(_) => Ok(false),
        None if cfg!(feature = "ib") => {
            // Without a data path the answer is no whatever the probe finds, so only the first
            // communicator of a process probes, to say why in the log; splits and later
            // communicators skip the library and device walk.
            static LOGGED: std::sync::Once = std::sync::Once::new();
            LOGGED.call_once(|| match &find_ports(config) {
                Err(why) => tracing::info!("occl: ib transport not used: {why}; peers on other hosts use tcp"),
                Ok(ports) => tracing::info!(
                    "occl: RDMA port(s) {ports} found, but the ib data path is not built yet; peers on other hosts use tcp"
                ),
            });
            Ok(false)
        }
        None => Ok(false),
    }
}

/// A failed completion on the QP to `peer`, as the error every operation waiting on that peer
/// reports: a verbs error status is the peer's (or the path's) failure, a broken flow-control
/// protocol is a corrupted peer or an occl bug.
// Called by the data path's progress loop once it exists; tested now.
#[cfg(feature = "ib")]
#[allow(dead_code)]
pub(crate) fn completion_error(peer: usize, e: &ibverbs::completion::CompletionError) -> Error {
    use ibverbs::completion::CompletionError;
    match e {
        CompletionError::Wc(wc) if wc.is_flush() => {
            Error::remote(peer, format!("ib: {wc} (an earlier completion on this connection failed first)"))
        }
        CompletionError::Wc(wc) => Error::remote(peer, format!("ib: {wc}")),
        CompletionError::Protocol(p) => Error::internal(format!("ib connection to rank {peer}: {p}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn forced_ib_without_a_device_is_invalid_usage_naming_why() {
        let config = Config { transport: Some(TransportKind::Ib), ..Config::default() };
        let e = probe(&config).expect_err("no device on a test machine");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        let text = e.to_string();
        assert!(text.contains("OCCL_TRANSPORT=ib"), "{text}");
        if cfg!(feature = "ib") {
            // Which reason depends on the machine: no library, no device, or no data path.
            assert!(
                text.contains("libibverbs.so.1 not found")
                    || text.contains("no usable RDMA device")
                    || text.contains("no ib data path"),
                "{text}"
            );
        } else {
            assert!(text.contains("built without its `ib` feature"), "{text}");
        }
    }

    #[test]
    fn forced_error_texts() {
        let e = forced_error(Err("libibverbs.so.1 not found: install rdma-core".into()));
        assert_eq!(
            e.to_string(),
            "invalid usage: OCCL_TRANSPORT=ib, but no RDMA device is usable: libibverbs.so.1 not found: install rdma-core"
        );
        let e = forced_error(Ok("mlx5_0:1".into()));
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("mlx5_0:1 are usable") && e.to_string().contains("OCCL_TRANSPORT=tcp"));
    }

    #[cfg(feature = "ib")]
    #[test]
    fn failed_completions_become_remote_errors_naming_the_peer() {
        use ibverbs::completion::{classify, CompletionError, Endpoint};
        let wc = ibverbs::sys::IbvWc { status: 12, wr_id: 3, ..Default::default() };
        let Err(wc_err) = classify(&wc) else { panic!("status 12 is a failure") };
        let e = completion_error(5, &CompletionError::Wc(wc_err));
        assert_eq!(e.kind(), ErrorKind::RemoteError);
        let text = e.to_string();
        assert!(
            text.starts_with("remote error: peer rank 5: ib: work request 3 failed: IBV_WC_RETRY_EXC_ERR"),
            "{text}"
        );
        let mut ep = Endpoint::new(1, 0, 0).expect("endpoint");
        let Err(p) = ep.send.handle_credit(9) else { panic!("credit for nothing sent") };
        let e = completion_error(2, &CompletionError::Protocol(p));
        assert_eq!(e.kind(), ErrorKind::InternalError);
        assert!(e.to_string().contains("ib connection to rank 2"), "{e}");
    }

    #[test]
    fn automatic_and_forced_other_never_offer_ib_yet() {
        for transport in [None, Some(TransportKind::Tcp), Some(TransportKind::Shm)] {
            let config = Config { transport, ..Config::default() };
            assert!(!probe(&config).expect("not forced"), "{transport:?}");
        }
    }
}
