//! The JSON dump of a recorder, and its atomic write into a directory.

use super::ring::{truncate_str, Entry, FlightRecorder, OpState, RootOrPeer, MAX_REASON_BYTES};
use crate::files;
use serde_json::{json, Value};
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The `format` of a dump.
pub const FORMAT: &str = "occl-flight-recorder";
/// The `version` of the dump layout; raised when a field changes meaning or goes away.
pub const FORMAT_VERSION: u32 = 1;

/// Wall-clock nanoseconds since the Unix epoch (dump time only; never on the hot path).
fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An entry's keys and values, in document order: every key present, `null` where a value
/// does not apply.
fn entry_fields(e: &Entry) -> [(&'static str, Value); 21] {
    let i = &e.info;
    let (root, peer) = match i.root_or_peer {
        Some(RootOrPeer::Root(r)) => (Some(r), None),
        Some(RootOrPeer::Peer(p)) => (None, Some(p)),
        None => (None, None),
    };
    let ended = |s| if e.state == s { e.t_ended_ns } else { None };
    [
        ("record_id", json!(e.record_id)),
        ("seq", json!(i.seq)),
        ("coll_seq", json!(i.coll_seq)),
        ("op", json!(i.op)),
        ("state", json!(e.state.as_str())),
        ("dtype", json!(i.dtype)),
        ("redop", json!(i.redop)),
        ("count", json!(i.count)),
        ("in_bytes", json!(i.in_bytes)),
        ("out_bytes", json!(i.out_bytes)),
        ("root", json!(root)),
        ("peer", json!(peer)),
        ("is_p2p", json!(peer.is_some())),
        ("algo", json!(i.algo)),
        ("proto", json!(i.proto)),
        ("t_enqueued_ns", json!(e.t_enqueued_ns)),
        ("t_started_ns", json!(e.t_started_ns)),
        ("t_completed_ns", json!(ended(OpState::Completed))),
        ("t_failed_ns", json!(ended(OpState::Failed))),
        ("duration_ns", json!(e.duration_ns())),
        ("error", json!(e.error)),
    ]
}

/// One entry as a JSON object (the keys of the `entries` items in the module docs).
pub fn entry_json(e: &Entry) -> Value {
    Value::Object(entry_fields(e).into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Writes `fields` as one compact JSON object, keys in the given order.
fn write_object<W: Write>(w: &mut W, fields: impl IntoIterator<Item = (&'static str, Value)>) -> io::Result<()> {
    let mut sep = "{";
    for (k, v) in fields {
        write!(w, "{sep}\"{k}\":")?;
        serde_json::to_writer(&mut *w, &v)?;
        sep = ",";
    }
    w.write_all(if sep == "{" { b"{}" } else { b"}" })
}

/// An object's keys and values, in document order.
type Fields = Vec<(&'static str, Value)>;

/// A top-level value: objects keep their key order in a dump file.
enum Item {
    Value(Value),
    Object(Fields),
}

impl Item {
    fn into_value(self) -> Value {
        match self {
            Item::Value(v) => v,
            Item::Object(f) => Value::Object(f.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
        }
    }
}

/// What the dump says about the whole ring besides its entries.
struct Summary {
    last_enqueued: Option<u64>,
    last_started: Option<u64>,
    last_completed: Option<u64>,
    in_flight: Option<Entry>,
}

impl FlightRecorder {
    fn summary(&self) -> Summary {
        let mut s = Summary { last_enqueued: None, last_started: None, last_completed: None, in_flight: None };
        self.for_each_entry(|e| {
            let seq = Some(e.info.seq);
            s.last_enqueued = s.last_enqueued.max(seq);
            if e.t_started_ns.is_some() || e.state == OpState::Completed {
                s.last_started = s.last_started.max(seq);
            }
            if e.state == OpState::Completed {
                s.last_completed = s.last_completed.max(seq);
            }
            if e.state.in_flight() && s.in_flight.is_none() {
                s.in_flight = Some(e);
            }
        });
        s
    }

    /// The document's keys before `entries`, in order.
    fn header(&self, reason: &str, dump_time_ns: u64) -> Vec<(&'static str, Item)> {
        let s = self.summary();
        let c = self.comm();
        let in_flight = match s.in_flight {
            Some(e) => {
                let age = dump_time_ns.saturating_sub(e.t_started_ns.unwrap_or(e.t_enqueued_ns));
                let mut fields = entry_fields(&e).to_vec();
                fields.push(("age_ns", json!(age)));
                Item::Object(fields)
            }
            None => Item::Value(Value::Null),
        };
        let v = Item::Value;
        vec![
            ("format", v(json!(FORMAT))),
            ("version", v(json!(FORMAT_VERSION))),
            ("reason", v(json!(truncate_str(reason, MAX_REASON_BYTES)))),
            ("dump_time_ns", v(json!(dump_time_ns))),
            ("pid", v(json!(c.pid))),
            ("host", v(json!(c.host))),
            (
                "comm",
                Item::Object(vec![
                    ("hash", json!(format!("{:016x}", c.comm_hash))),
                    ("name", json!(c.comm_name)),
                    ("rank", json!(c.rank)),
                    ("nranks", json!(c.nranks)),
                ]),
            ),
            ("capacity", v(json!(self.capacity()))),
            ("recorded", v(json!(self.recorded()))),
            (
                "status",
                Item::Object(vec![
                    ("last_enqueued_collective", json!(s.last_enqueued)),
                    ("last_started_collective", json!(s.last_started)),
                    ("last_completed_collective", json!(s.last_completed)),
                ]),
            ),
            ("in_flight", in_flight),
        ]
    }

    /// The dump document, dated now. See [`FlightRecorder::to_json_at`].
    pub fn to_json(&self, reason: &str) -> Value {
        self.to_json_at(reason, now_ns())
    }

    /// The dump document, dated `dump_time_ns`, as one value (a dump file holds the same, written
    /// entry by entry): the recorder's identity, the last sequence numbers per state (PyTorch's
    /// `pg_status` names), the oldest operation still in flight with its age, and the entries,
    /// oldest first. `reason` is cut to [`MAX_REASON_BYTES`].
    pub fn to_json_at(&self, reason: &str, dump_time_ns: u64) -> Value {
        let mut doc: serde_json::Map<String, Value> =
            self.header(reason, dump_time_ns).into_iter().map(|(k, v)| (k.to_owned(), v.into_value())).collect();
        let mut entries = Vec::with_capacity(self.capacity());
        self.for_each_entry(|e| entries.push(entry_json(&e)));
        doc.insert("entries".to_owned(), Value::Array(entries));
        Value::Object(doc)
    }

    /// Writes the dump document, dated now, to `w`. See [`FlightRecorder::write_json_at`].
    pub fn write_json<W: Write>(&self, w: W, reason: &str) -> io::Result<()> {
        self.write_json_at(w, reason, now_ns())
    }

    /// Writes the document of [`FlightRecorder::to_json_at`] to `w`, one top-level key per line
    /// and one entry per line (so `grep` finds an operation), streaming the entries: memory use
    /// does not grow with the capacity.
    pub fn write_json_at<W: Write>(&self, w: W, reason: &str, dump_time_ns: u64) -> io::Result<()> {
        let mut w = BufWriter::new(w);
        w.write_all(b"{\n")?;
        for (k, v) in self.header(reason, dump_time_ns) {
            write!(w, "  \"{k}\": ")?;
            match v {
                Item::Value(v) => serde_json::to_writer(&mut w, &v)?,
                Item::Object(f) => write_object(&mut w, f)?,
            }
            w.write_all(b",\n")?;
        }
        w.write_all(b"  \"entries\": [")?;
        let mut sep = "\n    ";
        let mut res = Ok(());
        self.for_each_entry(|e| {
            if res.is_ok() {
                res = w.write_all(sep.as_bytes()).and_then(|()| write_object(&mut w, entry_fields(&e)));
                sep = ",\n    ";
            }
        });
        res?;
        w.write_all(b"\n  ]\n}\n")?;
        w.flush()
    }

    /// The dump's file name: `occl_flight_<comm hash, 16 hex digits>_r<rank>_<pid>.json`.
    pub fn file_name(&self) -> String {
        let c = self.comm();
        format!("occl_flight_{:016x}_r{}_{}.json", c.comm_hash, c.rank, c.pid)
    }

    /// Writes the dump into `dir` (created if missing) as [`FlightRecorder::file_name`] (JSON)
    /// and [`FlightRecorder::torch_file_name`] (PyTorch's layout, for `torchfrtrace`), replacing
    /// this rank's earlier dump; returns the JSON file's path, written last. Each file appears
    /// whole or not at all, and is created so that nothing planted in a shared `dir` redirects it
    /// ([`crate::files`]).
    pub fn dump_to_dir(&self, dir: &Path, reason: &str) -> io::Result<PathBuf> {
        let path = dir.join(self.file_name());
        let named = |e: io::Error| io::Error::new(e.kind(), format!("flight recorder dump to {}: {e}", path.display()));
        fs::create_dir_all(dir).map_err(named)?;
        // write_atomic's errors already name the path.
        let dumped = |e: io::Error| io::Error::new(e.kind(), format!("flight recorder dump: {e}"));
        // The JSON file last: once it is there, so is the PyTorch file of the same dump.
        files::write_atomic(&dir.join(self.torch_file_name()), |f| self.write_torch_pickle(f)).map_err(dumped)?;
        files::write_atomic(&path, |f| self.write_json(f, reason)).map_err(dumped)?;
        Ok(path)
    }
}
