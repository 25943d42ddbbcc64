//! The live view's state and how keys and feed messages change it (no terminal here: tested directly).

use crate::model::{CommView, RankView, Snapshot};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::VecDeque;

/// Lines the event log keeps.
const LOG_CAP: usize = 1000;

/// What the feed threads report.
#[derive(Debug)]
pub enum Msg {
    Snapshot(Box<Snapshot>),
    /// A status query failed; the text says why (NVIDIA's messages).
    FetchFailed(String),
    /// A line from the server's MONITOR stream.
    Event(String),
    /// The monitor stream's state changed (`on`, `unsupported by this server`, `reconnecting`).
    Monitor(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    Comms,
    Ranks,
    Stuck,
    Log,
}

impl Panel {
    const ORDER: [Panel; 4] = [Panel::Comms, Panel::Ranks, Panel::Stuck, Panel::Log];

    fn step(self, by: isize) -> Panel {
        let i = Self::ORDER.iter().position(|p| *p == self).unwrap_or(0) as isize;
        Self::ORDER[(i + by).rem_euclid(Self::ORDER.len() as isize) as usize]
    }
}

pub struct App {
    /// `host:port` being watched.
    pub target: String,
    pub interval: f64,
    pub snap: Option<Snapshot>,
    /// When the last snapshot arrived (local `HH:MM:SS`).
    pub updated: String,
    /// The last refresh failed: why.
    pub stale: Option<String>,
    pub monitor: String,
    /// (time, text), oldest first.
    pub log: VecDeque<(String, String)>,
    pub focus: Panel,
    pub comm_sel: usize,
    pub rank_sel: usize,
    pub stuck_sel: usize,
    /// Lines scrolled up from the newest in the log.
    pub log_back: usize,
    /// Enter on a communicator: its ranks fill the screen.
    pub drill: bool,
    /// `j`: the raw report.
    pub raw: bool,
    pub raw_scroll: u16,
    pub filter: String,
    pub editing_filter: bool,
    pub quit: bool,
    /// Ask the poller for a snapshot now (`r`, or a monitor event).
    pub want_refresh: bool,
}

impl App {
    pub fn new(target: String, interval: f64) -> App {
        App {
            target,
            interval,
            snap: None,
            updated: String::new(),
            stale: None,
            monitor: "connecting".into(),
            log: VecDeque::new(),
            focus: Panel::Comms,
            comm_sel: 0,
            rank_sel: 0,
            stuck_sel: 0,
            log_back: 0,
            drill: false,
            raw: false,
            raw_scroll: 0,
            filter: String::new(),
            editing_filter: false,
            quit: false,
            want_refresh: false,
        }
    }

    pub fn log_line(&mut self, now: &str, text: String) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.log.push_back((now.to_string(), line.to_string()));
        }
        while self.log.len() > LOG_CAP {
            self.log.pop_front();
        }
    }

    /// Applies a feed message; `now` is the local time for the log.
    pub fn apply(&mut self, msg: Msg, now: &str) {
        match msg {
            Msg::Snapshot(s) => {
                let changes = match &self.snap {
                    Some(old) => s.changes_since(old),
                    None => vec![format!(
                        "connected to {} ({}): {} communicators, {} dead, {} unresponsive, {} failed, {} stuck",
                        self.target,
                        s.server,
                        s.comms.len(),
                        s.dead.len(),
                        s.unresponsive.len(),
                        s.failed.len(),
                        s.stuck.len()
                    )],
                };
                for c in changes {
                    self.log_line(now, c);
                }
                if let Some(why) = self.stale.take() {
                    self.log_line(now, format!("refresh works again (after: {why})"));
                }
                self.snap = Some(*s);
                self.updated = now.to_string();
                self.clamp();
            }
            Msg::FetchFailed(why) => {
                if self.stale.as_deref() != Some(why.as_str()) {
                    self.log_line(now, format!("refresh failed: {why}"));
                }
                self.stale = Some(why);
            }
            Msg::Event(line) => {
                self.log_line(now, format!("monitor: {line}"));
                self.want_refresh = true;
            }
            Msg::Monitor(state) => {
                if self.monitor != state {
                    self.log_line(now, format!("monitor stream {state}"));
                }
                self.monitor = state;
            }
        }
    }

    /// Communicators in display order: the unhealthy first, then by label/hash.
    pub fn comms(&self) -> Vec<&CommView> {
        let Some(s) = &self.snap else { return Vec::new() };
        let mut v: Vec<&CommView> = s.comms.iter().collect();
        v.sort_by_key(|c| (c.healthy(), c.label.clone(), c.hash));
        v
    }

    pub fn selected_comm(&self) -> Option<&CommView> {
        self.comms().get(self.comm_sel).copied()
    }

    /// Whether a rank passes the `/` filter: a number matches that rank; anything else is a case-insensitive
    /// substring of its state, host, pid or error. Several words: any may match.
    pub fn rank_matches(&self, r: &RankView) -> bool {
        let f = self.filter.trim();
        if f.is_empty() {
            return true;
        }
        f.split([' ', ',']).filter(|w| !w.is_empty()).any(|w| match w.parse::<u32>() {
            Ok(n) => r.rank == n,
            Err(_) => {
                let w = w.to_ascii_lowercase();
                [r.state.as_str(), r.host.as_str(), &r.pid.to_string(), r.error.as_deref().unwrap_or("")]
                    .iter()
                    .any(|f| f.to_ascii_lowercase().contains(&w))
            }
        })
    }

    /// The selected communicator's ranks, laggards first, filtered.
    pub fn ranks(&self) -> Vec<&RankView> {
        self.selected_comm()
            .map(|c| c.laggards_first().into_iter().filter(|r| self.rank_matches(r)).collect())
            .unwrap_or_default()
    }

    fn clamp(&mut self) {
        let n = self.comms().len();
        self.comm_sel = self.comm_sel.min(n.saturating_sub(1));
        let r = self.ranks().len();
        self.rank_sel = self.rank_sel.min(r.saturating_sub(1));
        let s = self.snap.as_ref().map_or(0, |s| s.failed.len() + s.stuck.len());
        self.stuck_sel = self.stuck_sel.min(s.saturating_sub(1));
        self.log_back = self.log_back.min(self.log.len().saturating_sub(1));
    }

    fn move_sel(&mut self, by: isize) {
        let step = |v: usize, n: usize| -> usize {
            if n == 0 {
                0
            } else {
                (v as isize + by).clamp(0, n as isize - 1) as usize
            }
        };
        if self.raw {
            self.raw_scroll = (self.raw_scroll as isize + by).clamp(0, u16::MAX as isize) as u16;
            return;
        }
        match self.focus {
            Panel::Comms => {
                let n = self.comms().len();
                let new = step(self.comm_sel, n);
                if new != self.comm_sel {
                    self.comm_sel = new;
                    self.rank_sel = 0;
                }
            }
            Panel::Ranks => self.rank_sel = step(self.rank_sel, self.ranks().len()),
            Panel::Stuck => {
                self.stuck_sel = step(self.stuck_sel, self.snap.as_ref().map_or(0, |s| s.failed.len() + s.stuck.len()))
            }
            // Up goes back in time.
            Panel::Log => {
                self.log_back =
                    (self.log_back as isize - by).clamp(0, self.log.len().saturating_sub(1) as isize) as usize
            }
        }
    }

    pub fn key(&mut self, k: KeyEvent) {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing_filter {
            match k.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.editing_filter = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if self.filter.len() < 64 => self.filter.push(c),
                _ => {}
            }
            self.rank_sel = 0;
            self.clamp();
            return;
        }
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Esc => {
                if self.raw {
                    self.raw = false;
                } else if self.drill {
                    self.drill = false;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                    self.clamp();
                }
            }
            KeyCode::Tab | KeyCode::Right => self.focus = self.focus.step(1),
            KeyCode::BackTab | KeyCode::Left => self.focus = self.focus.step(-1),
            KeyCode::Up => self.move_sel(-1),
            KeyCode::Down => self.move_sel(1),
            KeyCode::PageUp => self.move_sel(-10),
            KeyCode::PageDown => self.move_sel(10),
            KeyCode::Home => self.move_sel(-100_000),
            KeyCode::End => self.move_sel(100_000),
            KeyCode::Enter if self.focus == Panel::Comms && self.selected_comm().is_some() => {
                self.drill = true;
                self.focus = Panel::Ranks;
                self.rank_sel = 0;
            }
            KeyCode::Char('/') => {
                self.editing_filter = true;
                if !self.drill {
                    self.focus = Panel::Ranks;
                }
            }
            KeyCode::Char('j') => {
                self.raw = !self.raw;
                self.raw_scroll = 0;
            }
            KeyCode::Char('r') => self.want_refresh = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse;
    use crossterm::event::KeyEventKind;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent {
            code: c,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: crossterm::event::KeyEventState::NONE,
        }
    }

    fn app() -> App {
        let mut a = App::new("localhost:28028".into(), 2.0);
        let s = parse(include_str!("../../../ras/proto/tests/fixtures/C2_skew_ncclras.txt")).expect("parses");
        a.apply(Msg::Snapshot(Box::new(s)), "05:00:00");
        a
    }

    #[test]
    fn unhealthy_comms_come_first_and_enter_drills_in() {
        let mut a = app();
        assert_eq!(a.comms()[0].verdict(), "MISMATCH");
        assert!(a.log.back().is_some_and(|(_, l)| l.starts_with("connected to localhost:28028 (NCCL 2.28.9)")));
        a.key(key(KeyCode::Enter));
        assert!(a.drill && a.focus == Panel::Ranks);
        assert_eq!(a.ranks()[0].rank, 1, "the laggard first");
        a.key(key(KeyCode::Esc));
        assert!(!a.drill);
        a.key(key(KeyCode::Left));
        a.key(key(KeyCode::Down));
        assert_eq!(a.comm_sel, 1);
        a.key(key(KeyCode::Down));
        assert_eq!(a.comm_sel, 1, "clamped at the last");
    }

    #[test]
    fn the_filter_selects_ranks_by_number_or_text() {
        let mut a = app();
        a.key(key(KeyCode::Char('/')));
        a.key(key(KeyCode::Char('0')));
        assert_eq!(a.ranks().iter().map(|r| r.rank).collect::<Vec<_>>(), vec![0]);
        a.key(key(KeyCode::Backspace));
        for c in "566".chars() {
            a.key(key(KeyCode::Char(c)));
        }
        // A number is a rank number, so pid 566 matches nothing…
        assert!(a.ranks().is_empty());
        a.key(key(KeyCode::Esc));
        assert_eq!(a.ranks().len(), 2);
        // …but text matches hosts and states.
        a.key(key(KeyCode::Char('/')));
        for c in "192.0".chars() {
            a.key(key(KeyCode::Char(c)));
        }
        a.key(key(KeyCode::Enter));
        assert!(!a.editing_filter);
        assert_eq!(a.ranks().len(), 2);
        a.key(key(KeyCode::Char('q')));
        assert!(a.quit);
    }

    #[test]
    fn failures_and_events_are_logged_once() {
        let mut a = app();
        let n = a.log.len();
        a.apply(Msg::FetchFailed("Connection timed out".into()), "05:00:01");
        a.apply(Msg::FetchFailed("Connection timed out".into()), "05:00:02");
        assert_eq!(a.log.len(), n + 1);
        a.apply(Msg::Event("[2026-11-22 05:00:03] PEER_DEAD: Process 9 on node h managing GPU 0".into()), "05:00:03");
        assert!(a.want_refresh);
        a.key(key(KeyCode::Char('j')));
        assert!(a.raw);
    }
}
