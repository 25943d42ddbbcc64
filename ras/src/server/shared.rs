//! What the RAS thread's tasks share, and how they reach the mesh task: the server's settings and state
//! ([`Shared`]), its commands (a status gather, the node's metrics: [`gather`], [`node_metrics`]) and the inputs
//! the connection tasks send it ([`Input`]). Only the mesh task (`actor`) holds the mesh; everything else asks it.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};

use super::ending::Ending;
use super::node_dir::NodeDir;
use super::{Cmd, Event, Gathered, NodeMetrics, RasConfig};
use crate::mesh::{ConnId, PeerId};
use crate::record::ProcessRecords;
use crate::wire::Msg;

/// What the tasks of the RAS thread share.
#[derive(Clone)]
pub(crate) struct Shared {
    pub cfg: RasConfig,
    /// This process's place among the node's jobs (`None`: the port is not shared, or the directory is unusable).
    pub node: Option<NodeDir>,
    /// Whether this process holds the client port now.
    pub owner: Arc<AtomicBool>,
    /// The job's name: the `job` label, and what clients pick a job of the node by.
    pub job: Arc<str>,
    pub secret: [u8; 16],
    pub records: Arc<ProcessRecords>,
    pub events: broadcast::Sender<Event>,
    pub cmds: mpsc::UnboundedSender<Cmd>,
    pub mesh_addr: SocketAddr,
    /// Whether the job has ended here without a failure (`occl_ras_job_running`).
    pub ending: Arc<Ending>,
}

/// What the connection tasks tell the mesh task.
pub(crate) enum Input {
    Cmd(Cmd),
    Incoming(tokio::net::TcpStream),
    Connected { conn: ConnId, peer: PeerId, stream: tokio::net::TcpStream },
    ConnectFailed { peer: PeerId },
    Msg { conn: ConnId, msg: Msg },
    Closed { conn: ConnId },
}

/// Gathers the job's status through the mesh task.
pub(crate) async fn gather(sh: &Shared, budget: Duration) -> Result<Gathered, String> {
    let (tx, rx) = oneshot::channel();
    sh.cmds.send(Cmd::Status { budget, reply: tx }).map_err(|_| "the RAS thread is stopping".to_string())?;
    rx.await.map_err(|_| "the gather was dropped".to_string())?
}

/// Collects the metrics of every process of this node through the mesh task, waiting at most `timeout` for each.
pub(crate) async fn node_metrics(sh: &Shared, timeout: Duration) -> Result<NodeMetrics, String> {
    let (tx, rx) = oneshot::channel();
    sh.cmds.send(Cmd::Metrics { timeout, reply: tx }).map_err(|_| "the RAS thread is stopping".to_string())?;
    rx.await.map_err(|_| "the metrics fetch was dropped".to_string())
}
