//! What one process of the node asks another over that process's socket in the node's directory (`node_dir`): one
//! line, answered until EOF. The port's owner asks for what it cannot answer itself (another job's report, series
//! or events, another process's flight records); `node` answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::client::{EventGroups, Format};

/// The longest an ask waits to connect and for its answer to begin, and between its lines.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest line an ask sends.
pub(crate) const MAX_ASK_LINE: usize = 256;

/// What the port's owner asks another process of the node, one line, answered until EOF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// `1 <job>` or `0 <job>`: whether it owns the port, and its job.
    Who,
    /// Its job's report, as `STATUS` gives it.
    Status { verbose: bool, format: Format, budget_ms: u64 },
    /// Its job's `/metrics`, every series labelled with the job.
    Metrics { budget_ms: u64 },
    /// Its job's monitor events, as `MONITOR` streams them.
    Monitor { groups: EventGroups, format: Format },
    /// Its flight records (`/api/v1/flight-recorder` of that process alone).
    Flight,
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Text => "text",
        Format::Json => "json",
    }
}

impl Ask {
    pub(crate) fn line(&self) -> String {
        match self {
            Ask::Who => "WHO\n".into(),
            Ask::Status { verbose, format, budget_ms } => {
                format!("STATUS {} {} {budget_ms}\n", u8::from(*verbose), format_name(*format))
            }
            Ask::Metrics { budget_ms } => format!("METRICS {budget_ms}\n"),
            Ask::Monitor { groups, format } => {
                format!("MONITOR {} {} {}\n", u8::from(groups.lifecycle), u8::from(groups.trace), format_name(*format))
            }
            Ask::Flight => "FLIGHT\n".into(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Ask> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let flag = |s: &str| match s {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let format = |s: &str| match s {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        };
        match w.as_slice() {
            ["WHO"] => Some(Ask::Who),
            ["FLIGHT"] => Some(Ask::Flight),
            ["STATUS", v, f, ms] => {
                Some(Ask::Status { verbose: flag(v)?, format: format(f)?, budget_ms: ms.parse().ok()? })
            }
            ["METRICS", ms] => Some(Ask::Metrics { budget_ms: ms.parse().ok()? }),
            ["MONITOR", l, t, f] => {
                Some(Ask::Monitor { groups: EventGroups { lifecycle: flag(l)?, trace: flag(t)? }, format: format(f)? })
            }
            _ => None,
        }
    }
}

fn connect(path: &Path, a: &Ask, limit: Duration) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    s.set_write_timeout(Some(ASK_TIMEOUT))?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(a.line().as_bytes())?;
    Ok(s)
}

/// Asks the process at `path` and reads the whole answer (blocking; at most `limit` between reads).
pub(crate) fn ask_within(path: &Path, a: &Ask, limit: Duration) -> std::io::Result<String> {
    let mut s = connect(path, a, limit)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Asks the process at `path` and reads the whole answer (blocking; at most the ask's budget and [`ASK_TIMEOUT`]
/// between reads).
pub(crate) fn ask(path: &Path, a: &Ask) -> std::io::Result<String> {
    let budget = match a {
        Ask::Status { budget_ms, .. } | Ask::Metrics { budget_ms } => Duration::from_millis(*budget_ms),
        _ => Duration::ZERO,
    };
    ask_within(path, a, budget + ASK_TIMEOUT)
}

/// [`ask`] off the runtime's thread.
pub(crate) async fn ask_async(path: PathBuf, a: Ask) -> std::io::Result<String> {
    tokio::task::spawn_blocking(move || ask(&path, &a))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
}

/// Streams the monitor lines of the process at `path` into `tx` until either side stops.
pub(crate) fn monitor_lines(path: PathBuf, groups: EventGroups, format: Format, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        let a = Ask::Monitor { groups, format };
        let Ok(s) = connect(&path, &a, Duration::from_secs(3600)) else { return };
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            if tx.blocking_send(line + "\n").is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_read_back_as_sent() {
        let asks = [
            Ask::Who,
            Ask::Status { verbose: true, format: Format::Json, budget_ms: 5000 },
            Ask::Status { verbose: false, format: Format::Text, budget_ms: 0 },
            Ask::Metrics { budget_ms: 1500 },
            Ask::Monitor { groups: EventGroups::ALL, format: Format::Text },
            Ask::Monitor { groups: EventGroups::DEFAULT, format: Format::Json },
            Ask::Flight,
        ];
        for a in asks {
            assert_eq!(Ask::parse(&a.line()), Some(a.clone()), "{}", a.line());
        }
        for bad in ["", "WHO x", "FLIGHT 1", "STATUS 2 text 1", "METRICS -1", "MONITOR 1 1 xml", "STATUS 1 text"] {
            assert_eq!(Ask::parse(bad), None, "{bad:?}");
        }
    }
}
