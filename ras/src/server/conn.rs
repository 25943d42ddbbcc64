//! One mesh connection: a reader task that decodes frames into mesh inputs and a writer task that drains an
//! outgoing queue. Frames are bounded by the decoder (handshake limit until the peer proved the job secret).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::shared::Input;
use crate::mesh::ConnId;
use crate::wire::{self, Decoder, Msg};

/// The mesh task's end of a connection.
pub(crate) struct ConnHandle {
    out: mpsc::UnboundedSender<Vec<u8>>,
    authed: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl ConnHandle {
    pub(crate) fn send(&self, msg: &Msg) {
        let mut buf = Vec::new();
        match wire::encode(msg, &mut buf) {
            Ok(()) => {
                let _ = self.out.send(buf);
            }
            Err(e) => tracing::warn!("occl-ras: cannot encode {}: {e}", msg.name()),
        }
    }

    /// The peer authenticated: frames up to the full limit are accepted from now on.
    pub(crate) fn authenticated(&self) {
        self.authed.store(true, Ordering::Relaxed);
    }

    /// Closes after writing what is queued.
    pub(crate) async fn close(self) {
        drop(self.out);
        let _ = self.writer.await;
        self.reader.abort();
    }
}

pub(crate) fn spawn(conn: ConnId, stream: TcpStream, inputs: mpsc::UnboundedSender<Input>) -> ConnHandle {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (out, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
    let authed = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(async move {
        while let Some(buf) = queue.recv().await {
            if wr.write_all(&buf).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let flag = authed.clone();
    let reader = tokio::spawn(async move {
        let mut dec = Decoder::handshake();
        let mut buf = vec![0u8; 64 << 10];
        let mut full = false;
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !full && flag.load(Ordering::Relaxed) {
                dec.set_max_frame(wire::MAX_FRAME);
                full = true;
            }
            let mut bad = dec.push(&buf[..n]).is_err();
            while !bad {
                match dec.next() {
                    Ok(Some(msg)) => {
                        // The frames after the last handshake message may be large (status replies); if the proof
                        // was wrong the mesh closes the connection, so one bounded frame is the most a stranger
                        // gets in.
                        if !full && matches!(msg, Msg::HelloAck(_) | Msg::HelloFinish(_)) {
                            dec.set_max_frame(wire::MAX_FRAME);
                            full = true;
                        }
                        if inputs.send(Input::Msg { conn, msg }).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("occl-ras: malformed frame on connection {}: {e}; closing it", conn.0);
                        bad = true;
                    }
                }
            }
            if bad {
                break;
            }
        }
        let _ = inputs.send(Input::Closed { conn });
    });
    ConnHandle { out, authed, writer, reader }
}
