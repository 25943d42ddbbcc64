//! The terminal while the live view runs: raw mode and the alternate screen, given back on every way out —
//! normal return, error, and panic (a hook restores the terminal before the panic message prints).

use crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{self, Stdout};

pub type Term = Terminal<CrosstermBackend<Stdout>>;

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

/// Owns the terminal's modes; dropping it restores them.
pub struct Guard {
    pub term: Term,
}

impl Guard {
    pub fn enter() -> io::Result<Guard> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        enable_raw_mode()?;
        if let Err(e) = execute!(io::stdout(), EnterAlternateScreen, cursor::Hide) {
            restore();
            return Err(e);
        }
        match Terminal::new(CrosstermBackend::new(io::stdout())) {
            Ok(term) => Ok(Guard { term }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}
