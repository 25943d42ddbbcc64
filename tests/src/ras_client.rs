//! Minimal clients of the RAS port for tests: NCCL's text protocol and plain HTTP/1.1, over std sockets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A free loopback port for a job's `OCCL_RAS_ADDR` (bound and released: another process could take it first,
/// which the caller sees as a connection to the wrong server, never as a wrong answer from ours).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(28_500, |a| a.port())
}

/// Sends `lines` and reads until the server closes (a `STATUS` report), within `limit`.
pub fn ncclras(port: u16, lines: &str, limit: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(lines.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `GET path`; returns the status code and body.
pub fn http_get(port: u16, path: &str, limit: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(limit))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let code = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    Ok((code, body))
}

/// A `/metrics` body with every `job="…"` label taken out, so that a test can look a series up by its other labels.
pub fn without_job(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    for line in body.lines() {
        match line.find("job=\"") {
            Some(i) if !line.starts_with('#') => {
                let end = line[i + 5..].find('"').map_or(line.len(), |e| i + 5 + e + 1);
                let (head, tail) = (&line[..i], &line[end..]);
                // `{job="x",a="b"}`, `{a="b",job="x"}` or `{job="x"}`.
                let tail = tail.strip_prefix(',').unwrap_or(tail);
                let head = if tail.starts_with('}') { head.strip_suffix(',').unwrap_or(head) } else { head };
                let joined = format!("{head}{tail}");
                out.push_str(&joined.replace("{}", ""));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_job_label_comes_out_wherever_it_is() {
        let body = "# TYPE x gauge\nx{job=\"a\",s=\"1\"} 2\nx{s=\"1\",job=\"a\"} 3\nx{job=\"a\"} 4\nx 5\n";
        assert_eq!(super::without_job(body), "# TYPE x gauge\nx{s=\"1\"} 2\nx{s=\"1\"} 3\nx 4\nx 5\n");
    }
}
