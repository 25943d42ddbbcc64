//! NVIDIA's `ncclras` command line (getopt_long with `f:h:m::p:t:v`, `--help`, `--version`), plus occl's
//! `--tui` and `--interval`. Parsed by hand so that `-mall`, `-m`, `--monitor=trace`, `-tx` and bundled short
//! flags behave as getopt makes them behave.
//!
//! Where `-h`/`-p` are not given, the address is the one the job's servers listen on: `OCCL_RAS_ADDR`, else
//! `NCCL_RAS_ADDR` (`host:port`, `[v6]:port`, a bare port or a bare host), else `localhost:28028`.

use std::fmt;

pub const DEFAULT_HOST: &str = "localhost";
pub const DEFAULT_PORT: &str = "28028";
/// NCCL's `RAS_COLLECTIVE_LEG_TIMEOUT_SEC`: the server's per-leg default, which the client's read timeout covers.
pub const LEG_TIMEOUT_SECS: u64 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub host: String,
    /// As given: getaddrinfo takes a service name too.
    pub port: String,
    /// `-t`: `None` sends no `TIMEOUT` command.
    pub timeout: Option<u64>,
    pub verbose: bool,
    /// `-f`: `None` sends no `SET FORMAT` command (servers before 2.28.7 do not know it).
    pub format: Option<Format>,
    /// `-m[GROUPS]`: `Some(None)` is the server's default group.
    pub monitor: Option<Option<String>>,
    pub tui: bool,
    /// `--interval`: seconds between refreshes of the live view.
    pub interval: f64,
    /// `--job`: which of the jobs sharing the node's port to ask (`None`: the server answers for all of them).
    pub job: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: DEFAULT_HOST.into(),
            port: DEFAULT_PORT.into(),
            timeout: None,
            verbose: false,
            format: None,
            monitor: None,
            tui: false,
            interval: 2.0,
            job: None,
        }
    }
}

impl Options {
    /// Whether host and port are the defaults (selects NVIDIA's hint after a failed connect).
    pub fn is_default_address(&self) -> bool {
        self.host == DEFAULT_HOST && self.port == DEFAULT_PORT
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(Options),
    Help,
    Version,
}

/// A bad command line: the message (if any) goes to stderr, then the usage, and the exit code is 1 — except
/// NVIDIA's own value checks (`-f`, `-t`), which print only their message.
#[derive(Debug, PartialEq)]
pub struct UsageError {
    pub message: String,
    pub show_usage: bool,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub fn usage(argv0: &str) -> String {
    format!(
        "Usage: {argv0} [OPTION]...\n\
         Query the state of a running NCCL or occl job.\n\
         \n\
         Options:\n\
         \x20 -f, --format=FMT    Output format: text or json (text by default)\n\
         \x20 -h, --host=HOST     Host name or IP address of the RAS client socket of the\n\
         \x20                     job to connect to (by default the host of\n\
         \x20                     OCCL_RAS_ADDR or NCCL_RAS_ADDR, else localhost)\n\
         \x20 -m, --monitor[=GROUPS] Monitor mode: continuously watch for peer changes.\n\
         \x20                     Optional GROUPS: lifecycle, trace, all, or\n\
         \x20                     combinations like lifecycle,trace (lifecycle by default)\n\
         \x20 -p, --port=PORT     TCP port of the RAS client socket of the job\n\
         \x20                     (by default the port of OCCL_RAS_ADDR or\n\
         \x20                     NCCL_RAS_ADDR, else {DEFAULT_PORT})\n\
         \x20 -t, --timeout=SECS  Maximum time for the local process to wait for\n\
         \x20                     responses from other processes\n\
         \x20                     ({LEG_TIMEOUT_SECS} secs by default; 0 disables the timeout)\n\
         \x20 -v, --verbose       Increase the verbosity level of the RAS output\n\
         \x20     --tui           Live terminal view: communicators, lagging ranks, dead\n\
         \x20                     processes, stuck operations and events (q quits)\n\
         \x20     --interval=SECS Seconds between refreshes of the live view (2 by default)\n\
         \x20     --job=ID        The job to ask, when several jobs share the node's port\n\
         \x20                     (OCCL_JOB_ID, SLURM_JOB_ID or TORCHELASTIC_RUN_ID; every job by default)\n\
         \x20     --help          Print this help and exit\n\
         \x20     --version       Print the version number and exit\n"
    )
}

fn bad(message: String) -> UsageError {
    UsageError { message, show_usage: false }
}

fn with_usage(message: String) -> UsageError {
    UsageError { message, show_usage: true }
}

fn set(o: &mut Options, opt: char, value: Option<String>) -> Result<(), UsageError> {
    // `value` is present for every option that takes one (the caller fetched it), optional only for `m`.
    let v = value.unwrap_or_default();
    match opt {
        'f' => {
            o.format = Some(match v.to_ascii_lowercase().as_str() {
                "text" => Format::Text,
                "json" => Format::Json,
                _ => return Err(bad(format!("Invalid format: {v} (must be text or json)"))),
            })
        }
        'h' => o.host = v,
        'p' => o.port = v,
        't' => o.timeout = Some(v.parse::<u64>().map_err(|_| bad(format!("Invalid timeout: {v}")))?),
        'j' => {
            if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!("Invalid job: {v} (a job id without spaces)")));
            }
            o.job = Some(v);
        }
        'i' => {
            o.interval = match v.parse::<f64>() {
                Ok(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => s,
                _ => return Err(bad(format!("Invalid interval: {v} (seconds, 0.1 to 3600)"))),
            }
        }
        _ => return Err(with_usage(String::new())),
    }
    Ok(())
}

/// The address variables the client reads, in the order it reads them (as the server does).
pub const ADDR_VARS: [&str; 2] = ["OCCL_RAS_ADDR", "NCCL_RAS_ADDR"];

/// Splits a RAS address as the server reads it: `host:port`, `[v6]:port`, a bare port (host left `None`) or a bare
/// host, IPv6 without brackets included (port left `None`).
fn split_addr(v: &str) -> Option<(Option<String>, Option<String>)> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    if let Some(rest) = v.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) if !host.is_empty() && !port.is_empty() => Some((Some(host.into()), Some(port.into()))),
            None if !host.is_empty() && after.is_empty() => Some((Some(host.into()), None)),
            _ => None,
        };
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return Some((None, Some(v.into())));
    }
    match v.split_once(':') {
        Some((host, port)) if !port.contains(':') => {
            (!host.is_empty() && !port.is_empty()).then(|| (Some(host.into()), Some(port.into())))
        }
        _ => Some((Some(v.into()), None)),
    }
}

/// The defaults before the command line: [`ADDR_VARS`]' first set variable, read through `var`.
fn env_defaults(var: &dyn Fn(&str) -> Option<String>) -> Result<Options, UsageError> {
    let mut o = Options::default();
    let Some((name, value)) = ADDR_VARS.iter().find_map(|n| var(n).map(|v| (*n, v))) else { return Ok(o) };
    let (host, port) =
        split_addr(&value).ok_or_else(|| bad(format!("Invalid {name}: {value} (host:port, [addr]:port or port)")))?;
    if let Some(h) = host {
        o.host = h;
    }
    if let Some(p) = port {
        o.port = p;
    }
    Ok(o)
}

/// Parses `args` (without `argv[0]`) over the defaults that `var` (the environment) gives. Non-option arguments are
/// ignored, as NVIDIA's client ignores them.
pub fn parse<I: IntoIterator<Item = String>>(
    args: I,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Parsed, UsageError> {
    let mut o = env_defaults(var)?;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let opt = match name {
                "help" => return Ok(Parsed::Help),
                "version" => return Ok(Parsed::Version),
                "verbose" => {
                    o.verbose = true;
                    continue;
                }
                "tui" => {
                    o.tui = true;
                    continue;
                }
                "monitor" => {
                    o.monitor = Some(inline);
                    continue;
                }
                "format" => 'f',
                "host" => 'h',
                "port" => 'p',
                "timeout" => 't',
                "interval" => 'i',
                "job" => 'j',
                _ => return Err(with_usage(format!("unrecognized option '--{name}'"))),
            };
            let value = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| with_usage(format!("option '--{name}' requires an argument")))?,
            };
            set(&mut o, opt, Some(value))?;
            continue;
        }
        let Some(shorts) = a.strip_prefix('-').filter(|s| !s.is_empty()) else { continue };
        for (i, c) in shorts.char_indices() {
            let rest = &shorts[i + c.len_utf8()..];
            match c {
                'v' => o.verbose = true,
                'm' => {
                    // getopt's optional argument: only when attached (`-mall`).
                    o.monitor = Some((!rest.is_empty()).then(|| rest.to_string()));
                    break;
                }
                'f' | 'h' | 'p' | 't' => {
                    let value = if rest.is_empty() {
                        it.next().ok_or_else(|| with_usage(format!("option requires an argument -- '{c}'")))?
                    } else {
                        rest.to_string()
                    };
                    set(&mut o, c, Some(value))?;
                    break;
                }
                _ => return Err(with_usage(format!("invalid option -- '{c}'"))),
            }
        }
    }
    Ok(Parsed::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Parsed, UsageError> {
        parse(args.iter().map(|s| s.to_string()), &|_| None)
    }

    fn with_env(env: &[(&str, &str)], args: &[&str]) -> Result<Parsed, UsageError> {
        let var = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        parse(args.iter().map(|s| s.to_string()), &var)
    }

    fn address(env: &[(&str, &str)], args: &[&str]) -> (String, String) {
        match with_env(env, args) {
            Ok(Parsed::Run(o)) => (o.host, o.port),
            other => panic!("{env:?} {args:?}: {other:?}"),
        }
    }

    #[test]
    fn the_address_defaults_to_the_servers_variables() {
        let at = |h: &str, p: &str| (h.to_string(), p.to_string());
        assert_eq!(address(&[], &[]), at(DEFAULT_HOST, DEFAULT_PORT));
        assert_eq!(address(&[("NCCL_RAS_ADDR", "node3:28030")], &[]), at("node3", "28030"));
        assert_eq!(address(&[("OCCL_RAS_ADDR", "[::1]:28031"), ("NCCL_RAS_ADDR", "x:1")], &[]), at("::1", "28031"));
        assert_eq!(address(&[("OCCL_RAS_ADDR", "28040")], &[]), at(DEFAULT_HOST, "28040"));
        assert_eq!(address(&[("OCCL_RAS_ADDR", "10.0.0.7")], &[]), at("10.0.0.7", DEFAULT_PORT));
        assert_eq!(address(&[("OCCL_RAS_ADDR", "fe80::1")], &[]), at("fe80::1", DEFAULT_PORT));
        // The command line wins, flag by flag.
        assert_eq!(address(&[("OCCL_RAS_ADDR", "node3:28030")], &["-p", "9"]), at("node3", "9"));
        assert_eq!(address(&[("OCCL_RAS_ADDR", "node3:28030")], &["-h", "a"]), at("a", "28030"));
        // An address from the environment is not the default: the failed-connect hint names NCCL_RAS_ADDR.
        match with_env(&[("OCCL_RAS_ADDR", "28040")], &[]) {
            Ok(Parsed::Run(o)) => assert!(!o.is_default_address()),
            other => panic!("{other:?}"),
        }
        for v in ["", "host:", ":1", "[::1", "[]:1", "[::1]x"] {
            let e = with_env(&[("OCCL_RAS_ADDR", v)], &[]).expect_err(v);
            assert!(e.message.starts_with("Invalid OCCL_RAS_ADDR") && !e.show_usage, "{v:?}: {e:?}");
        }
    }

    fn opts(args: &[&str]) -> Options {
        match run(args) {
            Ok(Parsed::Run(o)) => o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn nvidias_flags_in_getopts_forms() {
        assert_eq!(opts(&[]), Options::default());
        let o = opts(&["-h", "node7", "-p9000", "-t", "0", "-v", "-fjson"]);
        assert_eq!((o.host.as_str(), o.port.as_str(), o.timeout, o.verbose), ("node7", "9000", Some(0), true));
        assert_eq!(o.format, Some(Format::Json));
        let o = opts(&["--host=a", "--port", "1", "--timeout=3", "--format", "TEXT", "--verbose"]);
        assert_eq!((o.host.as_str(), o.port.as_str(), o.timeout, o.format), ("a", "1", Some(3), Some(Format::Text)));
        assert_eq!(opts(&["-m"]).monitor, Some(None));
        assert_eq!(opts(&["-mall"]).monitor, Some(Some("all".into())));
        assert_eq!(opts(&["--monitor=lifecycle,trace"]).monitor, Some(Some("lifecycle,trace".into())));
        // `-m all`: getopt's optional argument is attached or absent; `all` is a stray word.
        assert_eq!(opts(&["-m", "all"]).monitor, Some(None));
        assert!(opts(&["-vm"]).verbose);
        assert_eq!(opts(&["--job", "4242"]).job.as_deref(), Some("4242"));
        assert_eq!(opts(&["--job=run-1"]).job.as_deref(), Some("run-1"));
        assert!(run(&["--job="]).is_err() && run(&["--job", "a b"]).is_err());
        let o = opts(&["--tui", "--interval", "0.5"]);
        assert!(o.tui && o.interval == 0.5);
        assert!(!o.is_default_address() || o.host == DEFAULT_HOST);
    }

    #[test]
    fn help_version_and_errors() {
        assert_eq!(run(&["--help"]), Ok(Parsed::Help));
        assert_eq!(run(&["-v", "--version"]), Ok(Parsed::Version));
        assert_eq!(run(&["-f", "xml"]), Err(bad("Invalid format: xml (must be text or json)".into())));
        assert_eq!(run(&["-t", "-1"]), Err(bad("Invalid timeout: -1".into())));
        assert_eq!(run(&["-t5x"]), Err(bad("Invalid timeout: 5x".into())));
        assert!(run(&["-x"]).is_err_and(|e| e.show_usage));
        assert!(run(&["--bogus"]).is_err_and(|e| e.show_usage));
        assert!(run(&["-p"]).is_err_and(|e| e.show_usage));
        assert!(run(&["--interval=0"]).is_err());
        assert!(usage("ncclras").contains("-m, --monitor[=GROUPS]"));
    }
}
