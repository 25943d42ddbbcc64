//! `ncclras --tui`: the live view, in ratatui's state / update / render split — [`state`] holds what is shown and
//! how keys change it, [`view`] draws it, [`feed`] brings reports and monitor events from the job on threads of
//! their own, and [`term`] owns the terminal's modes.

mod feed;
mod state;
mod term;
mod view;

use crate::cli::Options;
use crossterm::event::{self, Event, KeyEventKind};
use std::io::IsTerminal;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Local wall-clock `HH:MM:SS` for the log (UTC offset from the C library, as `date` shows it).
fn now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let local = secs as i64 + utc_offset_secs();
    let d = local.rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", d / 3600, d / 60 % 60, d % 60)
}

/// The zone offset, from `TZ` when it is a plain `UTC±h`; otherwise UTC (the usual on cluster nodes).
fn utc_offset_secs() -> i64 {
    std::env::var("TZ")
        .ok()
        .and_then(|tz| tz.strip_prefix("UTC").and_then(|h| h.parse::<i64>().ok()))
        .map_or(0, |h| -h * 3600)
}

/// Runs the live view until `q`; returns the exit code.
pub fn run(o: &Options) -> u8 {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        eprintln!("ncclras: --tui needs a terminal; without --tui the report is printed");
        return 1;
    }
    let (tx, rx) = mpsc::channel();
    let (wake_tx, wake_rx) = mpsc::channel();
    {
        let (o, tx) = (o.clone(), tx.clone());
        std::thread::spawn(move || feed::poll(o, tx, wake_rx));
    }
    {
        let o = o.clone();
        std::thread::spawn(move || feed::monitor(o, tx));
    }
    let mut guard = match term::Guard::enter() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("ncclras: cannot set up the terminal: {e}");
            return 1;
        }
    };
    let mut app = state::App::new(format!("{}:{}", o.host, o.port), o.interval);
    loop {
        if let Err(e) = guard.term.draw(|f| view::render(f, &app)) {
            drop(guard);
            eprintln!("ncclras: drawing failed: {e}");
            return 1;
        }
        match event::poll(Duration::from_millis(100)) {
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => app.key(k),
                // The next draw uses the new size.
                Ok(_) => {}
                Err(_) => app.quit = true,
            },
            Ok(false) => {}
            Err(_) => app.quit = true,
        }
        while let Ok(m) = rx.try_recv() {
            app.apply(m, &now());
        }
        if app.want_refresh {
            app.want_refresh = false;
            let _ = wake_tx.send(());
        }
        if app.quit {
            return 0;
        }
    }
}
