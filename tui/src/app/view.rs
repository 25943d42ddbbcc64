//! Drawing the live view: header, summary, communicators, the selected communicator's ranks (laggards first, with
//! launched/completed bars), dead and unresponsive processes, failed and stuck operations, the event log and a key
//! line.
//! Everything fits 80×24; larger terminals get more rows. The header and the key line are built of parts that
//! are left out whole, least needed first, where a terminal is too narrow for them all: a line is never cut.

use super::state::{App, Panel};
use crate::model::{CommView, FailedView, RankView, StuckView};
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

const RED: Style = Style::new().fg(Color::Red);
const GREEN: Style = Style::new().fg(Color::Green);
const YELLOW: Style = Style::new().fg(Color::Yellow);
const DIM: Style = Style::new().fg(Color::DarkGray);
const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);

fn comm_style(c: &CommView) -> Style {
    if c.incomplete || c.error {
        RED
    } else if c.mismatch {
        YELLOW
    } else {
        GREEN
    }
}

fn rank_style(r: &RankView, max: u64) -> Style {
    match r.state.as_str() {
        "DEAD" | "ABORT" => RED,
        "UNRESPONSIVE" | "MISSING" => Style::new().fg(Color::Magenta),
        _ if r.error.is_some() => RED,
        _ if r.launched.is_some_and(|l| l < max) => YELLOW,
        _ => Style::new(),
    }
}

fn block<'a>(title: String, focused: bool) -> Block<'a> {
    let b = Block::default().borders(Borders::ALL).title(title);
    if focused {
        b.border_style(Style::new().fg(Color::Cyan)).title_style(BOLD)
    } else {
        b
    }
}

/// `██████░░░░` for `n` of `max`.
fn bar(n: u64, max: u64, width: usize) -> String {
    let fill = if max == 0 { width } else { ((n as f64 / max as f64) * width as f64).round() as usize };
    let fill = fill.min(width);
    format!("{}{}", "█".repeat(fill), "░".repeat(width - fill))
}

/// A communicator's short name: NCCL's `#group-index` where the report has one, else its hash's first 8 digits
/// (enough to tell comms apart on one screen; the full hash is in the ranks panel's title).
fn comm_name(c: &CommView) -> String {
    match (&c.label, c.hash) {
        (Some(l), _) => l.clone(),
        (None, h) => format!("{:08x}", h >> 32),
    }
}

fn comm_title(c: &CommView) -> String {
    match (&c.label, c.hash) {
        (Some(l), 0) => l.clone(),
        (Some(l), h) => format!("{l} ({h:016x})"),
        (None, h) => format!("{h:016x}"),
    }
}

pub fn render(f: &mut Frame<'_>, app: &App) {
    let area = f.area();
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Length(1), Constraint::Length(1), Constraint::Min(8), Constraint::Length(1)])
        .split(area);
    header(f, rows[0], app);
    summary(f, rows[1], app);
    if app.raw {
        raw(f, rows[2], app);
    } else if app.drill {
        let parts = Layout::default()
            .direction(Direction::Vertical)
            .constraints([Constraint::Min(5), Constraint::Length(6)])
            .split(rows[2]);
        ranks(f, parts[0], app);
        stuck(f, parts[1], app);
    } else {
        let parts = Layout::default()
            .direction(Direction::Vertical)
            .constraints([Constraint::Percentage(45), Constraint::Percentage(30), Constraint::Percentage(25)])
            .split(rows[2]);
        let top = Layout::default()
            .direction(Direction::Horizontal)
            .constraints([Constraint::Percentage(42), Constraint::Percentage(58)])
            .split(parts[0]);
        comms(f, top[0], app);
        ranks(f, top[1], app);
        let mid = Layout::default()
            .direction(Direction::Horizontal)
            .constraints([Constraint::Percentage(35), Constraint::Percentage(65)])
            .split(parts[1]);
        procs(f, mid[0], app);
        stuck(f, mid[1], app);
        log(f, parts[2], app);
    }
    keys(f, rows[3], app);
}

/// A part of a one-line bar and how much it is needed: 0 always shows; among the rest, the highest is left out
/// first while the line is wider than the terminal.
type Part<'a> = (u8, Span<'a>);

/// The parts that fit `width`, in their given order: optional ones are left out whole, highest number first.
fn fit_line(mut parts: Vec<Part<'_>>, width: u16) -> Line<'_> {
    let width = usize::from(width);
    while parts.iter().map(|(_, s)| s.width()).sum::<usize>() > width {
        let Some(drop) = parts.iter().enumerate().filter(|(_, (p, _))| *p > 0).max_by_key(|(i, (p, _))| (*p, *i))
        else {
            break;
        };
        let i = drop.0;
        parts.remove(i);
    }
    Line::from(parts.into_iter().map(|(_, s)| s).collect::<Vec<_>>())
}

fn header(f: &mut Frame<'_>, area: Rect, app: &App) {
    let mut parts: Vec<Part<'_>> = vec![
        (0, Span::styled(" ncclras ", BOLD.fg(Color::Black).bg(Color::Cyan))),
        (0, Span::raw(format!(" {} ", app.target))),
    ];
    match &app.snap {
        Some(s) => {
            let src = match s.source {
                crate::model::Source::Json => "json",
                crate::model::Source::Text => "text",
            };
            parts.push((0, Span::raw(format!("│ {} {src} │ {}", s.server, app.updated))));
            if let Some(g) = s.gather_secs {
                parts.push((3, Span::raw(format!(" ({g:.3}s)"))));
            }
        }
        None => parts.push((0, Span::styled("│ waiting for the first report…", DIM))),
    }
    parts.push((4, Span::raw(format!(" │ every {}s", app.interval))));
    parts.push((2, Span::raw(format!(" │ monitor {}", app.monitor))));
    if app.stale.is_some() {
        parts.push((0, Span::styled(" │ STALE", RED.add_modifier(Modifier::BOLD))));
    }
    f.render_widget(Paragraph::new(fit_line(parts, area.width)), area);
}

fn summary(f: &mut Frame<'_>, area: Rect, app: &App) {
    let Some(s) = &app.snap else {
        let why = app.stale.clone().unwrap_or_default();
        f.render_widget(Paragraph::new(Span::styled(format!(" {why}"), RED)), area);
        return;
    };
    let count = |p: fn(&CommView) -> bool| s.comms.iter().filter(|c| p(c)).count();
    let mut spans = Vec::new();
    if let Some(t) = s.totals {
        spans.push(Span::raw(format!(" Nodes {} Procs {} GPUs {} ", t.nodes, t.processes, t.gpus)));
    }
    spans.push(Span::raw(format!("Comms {} ", s.comms.len())));
    let flag = |n: usize, what: &str, bad: Style| Span::styled(format!("│ {what} {n} "), if n > 0 { bad } else { DIM });
    spans.push(flag(s.dead.len(), "DEAD", RED.add_modifier(Modifier::BOLD)));
    spans.push(flag(s.unresponsive.len(), "UNRESP", Style::new().fg(Color::Magenta)));
    spans.push(flag(count(|c| c.incomplete || c.error), "INCOMPL/ERR", RED));
    spans.push(flag(count(|c| c.mismatch), "MISMATCH", YELLOW));
    spans.push(flag(s.failed.len(), "FAILED", RED));
    spans.push(flag(s.stuck.len(), "STUCK", YELLOW));
    if s.timeouts > 0 {
        spans.push(flag(s.timeouts as usize, "TIMEOUTS", YELLOW));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn comms(f: &mut Frame<'_>, area: Rect, app: &App) {
    let list = app.comms();
    let rows: Vec<Row<'_>> = list
        .iter()
        .map(|c| {
            Row::new(vec![
                Cell::from(comm_name(c)),
                Cell::from(c.size.to_string()),
                Cell::from(c.status.clone()),
                Cell::from(c.verdict()),
            ])
            .style(comm_style(c))
        })
        .collect();
    let t =
        Table::new(rows, [Constraint::Length(9), Constraint::Length(4), Constraint::Length(8), Constraint::Min(10)])
            .header(Row::new(vec!["comm", "size", "status", "errors"]).style(BOLD))
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .block(block(format!("Communicators ({})", list.len()), app.focus == Panel::Comms));
    let mut st = TableState::default().with_selected((!list.is_empty()).then_some(app.comm_sel));
    f.render_stateful_widget(t, area, &mut st);
}

fn ranks(f: &mut Frame<'_>, area: Rect, app: &App) {
    let Some(c) = app.selected_comm() else {
        f.render_widget(
            Paragraph::new("no communicator").block(block("Ranks".into(), app.focus == Panel::Ranks)),
            area,
        );
        return;
    };
    let list = app.ranks();
    let max = c.max_launched();
    // The progress column gets what the fixed columns, spacing and borders leave.
    let room = (area.width as usize).saturating_sub(5 + 12 + 8 + 15 + 4 + 2);
    let fit = |n: String, of: u64| {
        let w = room.saturating_sub(n.len() + 1).clamp(2, 30);
        format!("{} {n}", bar(of, max, w))
    };
    let rows: Vec<Row<'_>> = list
        .iter()
        .map(|r| {
            let progress = match (r.launched, r.completed) {
                (Some(l), Some(done)) => fit(format!("{l}/{done}"), done),
                (Some(l), None) => fit(l.to_string(), l),
                _ => r.error.clone().unwrap_or_else(|| "—".into()),
            };
            Row::new(vec![
                Cell::from(r.rank.to_string()),
                Cell::from(r.state.clone()),
                Cell::from(r.pid.to_string()),
                Cell::from(r.host.clone()),
                Cell::from(progress),
            ])
            .style(rank_style(r, max))
        })
        .collect();
    let filter = if app.filter.is_empty() { String::new() } else { format!(" filter \"{}\"", app.filter) };
    // The full hash where the border has room for it, else the short name (the title is never cut).
    let title_with = |name: String| format!("Ranks of {name} — {} behind, {} shown{filter}", c.lagging(), list.len());
    let title = match title_with(comm_title(c)) {
        t if Span::raw(t.as_str()).width() + 2 <= usize::from(area.width) => t,
        _ => title_with(comm_name(c)),
    };
    let t = Table::new(
        rows,
        [
            Constraint::Length(5),
            Constraint::Length(12),
            Constraint::Length(8),
            Constraint::Length(15),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(vec!["rank", "state", "pid", "host", "launched/completed"]).style(BOLD))
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(block(title, app.focus == Panel::Ranks));
    let mut st =
        TableState::default().with_selected((!list.is_empty() && app.focus == Panel::Ranks).then_some(app.rank_sel));
    f.render_stateful_widget(t, area, &mut st);
}

fn procs(f: &mut Frame<'_>, area: Rect, app: &App) {
    let mut lines = Vec::new();
    if let Some(s) = &app.snap {
        for p in &s.dead {
            lines.push(Line::styled(format!("DEAD pid {} {} gpu {}", p.pid, p.host, p.gpus), RED));
        }
        for p in &s.unresponsive {
            lines.push(Line::styled(format!("UNRESPONSIVE pid {} {}", p.pid, p.host), Style::new().fg(Color::Magenta)));
        }
        if lines.is_empty() {
            lines.push(Line::styled("all processes answer", GREEN));
        }
    }
    f.render_widget(Paragraph::new(lines).block(block("Processes".into(), false)), area);
}

/// Failed operations (red, earliest first: often the cause of the rest), then stuck ones (yellow), in one table.
fn stuck(f: &mut Frame<'_>, area: Rect, app: &App) {
    let (no_stuck, no_failed): (Vec<StuckView>, Vec<FailedView>) = (Vec::new(), Vec::new());
    let list = app.snap.as_ref().map_or(&no_stuck, |s| &s.stuck);
    let failed = app.snap.as_ref().map_or(&no_failed, |s| &s.failed);
    let failed_rows = failed.iter().map(|x| {
        let op = x.operation.as_ref().map_or_else(|| "-".into(), |(op, seq)| format!("{op} #{seq}"));
        Row::new(vec![
            Cell::from(x.rank.to_string()),
            Cell::from(op),
            Cell::from("FAILED"),
            Cell::from(""),
            Cell::from(x.error.clone()),
        ])
        .style(RED)
    });
    let rows: Vec<Row<'_>> = failed_rows
        .chain(list.iter().map(|s| {
            Row::new(vec![
                Cell::from(s.rank.to_string()),
                Cell::from(format!("{} #{}", s.operation, s.seq)),
                Cell::from(format!("{}.{:01}s", s.waited_ms / 1000, (s.waited_ms % 1000) / 100)),
                Cell::from(s.peer.map_or("?".into(), |p| p.to_string())),
                Cell::from(s.step.clone()),
            ])
            .style(YELLOW)
        }))
        .collect();
    let n = rows.len();
    let title = match failed.len() {
        0 => format!("Stuck operations ({})", list.len()),
        f => format!("Failed operations ({f}), stuck ({})", list.len()),
    };
    let t = Table::new(
        rows,
        [
            Constraint::Length(5),
            Constraint::Length(18),
            Constraint::Length(8),
            Constraint::Length(5),
            Constraint::Min(8),
        ],
    )
    .header(Row::new(vec!["rank", "operation", "waited", "peer", "step / error"]).style(BOLD))
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(block(title, app.focus == Panel::Stuck));
    let mut st = TableState::default().with_selected((n > 0 && app.focus == Panel::Stuck).then_some(app.stuck_sel));
    f.render_stateful_widget(t, area, &mut st);
}

fn log(f: &mut Frame<'_>, area: Rect, app: &App) {
    let h = area.height.saturating_sub(2) as usize;
    let end = app.log.len().saturating_sub(app.log_back);
    let start = end.saturating_sub(h);
    let lines: Vec<Line<'_>> = app
        .log
        .range(start..end)
        .map(|(t, l)| {
            let style = if l.contains("DEAD") || l.contains("failed") {
                RED
            } else if l.contains("STUCK") || l.contains("MISMATCH") || l.contains("UNRESPONSIVE") {
                YELLOW
            } else {
                Style::new()
            };
            Line::from(vec![Span::styled(format!("{t} "), DIM), Span::styled(l.clone(), style)])
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block("Events".into(), app.focus == Panel::Log)), area);
}

fn raw(f: &mut Frame<'_>, area: Rect, app: &App) {
    let (text, title) = match &app.snap {
        Some(s) => (
            s.raw.as_str(),
            format!(
                "Raw report ({}) — j or Esc to close",
                match s.source {
                    crate::model::Source::Json => "JSON",
                    crate::model::Source::Text => "text",
                }
            ),
        ),
        None => ("", "Raw report".to_string()),
    };
    f.render_widget(
        Paragraph::new(text).wrap(Wrap { trim: false }).scroll((app.raw_scroll, 0)).block(block(title, true)),
        area,
    );
}

/// The key line: every key at 80 columns; narrower, the keys from the end are left out.
const KEYS: [&str; 8] = ["q quit", "tab panel", "↑↓ move", "Enter drill", "Esc back", "/ filter", "j raw", "r refresh"];

fn keys(f: &mut Frame<'_>, area: Rect, app: &App) {
    let parts: Vec<Part<'_>> = if app.editing_filter {
        vec![
            (0, Span::styled(" filter ranks: ", BOLD)),
            (0, Span::raw(format!("{}▏", app.filter))),
            (1, Span::styled("  (rank numbers or text; Enter keeps, Esc clears)", DIM)),
        ]
    } else {
        (0u8..).zip(KEYS).map(|(i, k)| (i, Span::styled(format!(" {k} "), DIM))).collect()
    };
    f.render_widget(Paragraph::new(fit_line(parts, area.width)), area);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::state::Msg;
    use crate::model::parse;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
        t.draw(|f| render(f, app)).expect("draw");
        let buf = t.backend().buffer().clone();
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>() + "\n").collect()
    }

    #[test]
    fn a_dead_rank_shows_at_80x24_and_at_tiny_sizes_nothing_panics() {
        let mut app = App::new("localhost:28028".into(), 2.0);
        let s = parse(include_str!("../../../ras/proto/tests/fixtures/A_kill_plus66_status.txt")).expect("parses");
        app.apply(Msg::Snapshot(Box::new(s)), "05:00:00");
        let out = screen(&app, 80, 24);
        assert!(out.contains("DEAD pid 735"), "{out}");
        assert!(out.contains("INCOMPLETE"), "{out}");
        assert!(out.contains("DEAD 1"), "{out}");
        for (w, h) in [(1, 1), (10, 5), (20, 12), (200, 60)] {
            screen(&app, w, h);
        }
    }

    /// Row `y` of the screen without its trailing blanks.
    fn row(out: &str, y: usize) -> String {
        out.lines().nth(y).unwrap_or_default().trim_end().to_string()
    }

    #[test]
    fn header_and_key_line_are_whole_at_80x24_and_lose_whole_parts_when_narrower() {
        let mut app = App::new("127.0.0.1:41234".into(), 0.5);
        let s = parse(include_str!("../../../ras/proto/tests/fixtures/A_kill_plus66_status.txt")).expect("parses");
        app.apply(Msg::Snapshot(Box::new(s)), "05:00:00");
        app.apply(Msg::Monitor("on".into()), "05:00:00");
        let out = screen(&app, 80, 24);
        let head = row(&out, 0);
        assert!(head.starts_with(" ncclras  127.0.0.1:41234 │ NCCL 2.28.9 text │ 05:00:00"), "{out}");
        assert!(head.ends_with(" │ monitor on"), "{out}");
        let keys = row(&out, 23);
        assert_eq!(keys, format!(" {}", KEYS.join("  ")), "{out}");

        // A long monitor state and a stale report at 80: STALE stays, the optional parts go whole.
        app.apply(Msg::Monitor("unsupported by this server".into()), "05:00:01");
        app.apply(Msg::FetchFailed("Connection refused".into()), "05:00:02");
        let head = row(&screen(&app, 80, 24), 0);
        assert!(head.ends_with("05:00:00 │ STALE"), "{head}");

        // Narrower: the key line ends in a whole key, never a cut one.
        for w in [40u16, 52, 64, 79] {
            let keys = row(&screen(&app, w, 24), 23);
            assert!(
                KEYS.iter().any(|k| keys.ends_with(k)) && Span::raw(keys.as_str()).width() <= usize::from(w),
                "{w}: {keys:?}"
            );
        }
        app.editing_filter = true;
        app.filter = "DEAD".into();
        let keys = row(&screen(&app, 80, 24), 23);
        assert!(keys.ends_with("Enter keeps, Esc clears)"), "{keys}");
        assert_eq!(row(&screen(&app, 40, 24), 23), " filter ranks: DEAD▏");
    }
}
