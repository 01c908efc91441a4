//! The live top-style view (ratatui + crossterm). State lives in [`app::App`]; this module
//! only owns the terminal and draws.

pub mod app;

use std::io;

use ratatui::{
    DefaultTerminal, Frame,
    layout::{Constraint, Layout},
    style::{Modifier, Style, Stylize},
    text::{Line, Text},
    widgets::{Cell, Paragraph, Row, Table, TableState},
};

use app::{App, Key};

/// The terminal in raw/alternate-screen mode; restored on drop and on panic.
pub struct Tui {
    terminal: DefaultTerminal,
}

impl Tui {
    /// Enters raw mode and the alternate screen; `ratatui::init` also installs a panic hook
    /// that restores the terminal before the panic message is printed.
    pub fn enter() -> io::Result<Tui> {
        let terminal = ratatui::try_init()?;
        Ok(Tui { terminal })
    }

    /// Draws `app`.
    pub fn draw(&mut self, app: &App) -> io::Result<()> {
        self.terminal.draw(|f| render(f, app))?;
        Ok(())
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// Maps a crossterm key event to a view key.
pub fn map_key(ev: &crossterm::event::KeyEvent) -> Option<Key> {
    use crossterm::event::{KeyCode, KeyEventKind, KeyModifiers};
    if ev.kind == KeyEventKind::Release {
        return None;
    }
    Some(match ev.code {
        KeyCode::Char('c') if ev.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Enter | KeyCode::Right | KeyCode::Left => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        _ => return None,
    })
}

fn pct(n: u64, total: u64) -> String {
    if total == 0 { "-".into() } else { format!("{:5.1}%", 100.0 * n as f64 / total as f64) }
}

fn render(f: &mut Frame, app: &App) {
    let [head, body, status] =
        Layout::vertical([Constraint::Length(2), Constraint::Min(3), Constraint::Length(2)]).areas(f.area());
    let s = &app.snapshot.status;
    let filter = if app.editing_filter {
        format!("filter: {}_", app.filter)
    } else if app.filter.is_empty() {
        "filter: (none)".into()
    } else {
        format!("filter: {}", app.filter)
    };
    let head_text = Text::from(vec![
        Line::from(format!("etm-bpf  {}  [{}]", s.target, s.target_state)).bold(),
        Line::from(format!(
            "sort: {} | {} | keys: q quit  s sort  i instructions  / filter  enter expand  c collapse  ↑↓ move",
            app.sort.label(),
            filter
        )),
    ]);
    f.render_widget(Paragraph::new(head_text), head);

    let total = app.snapshot.total;
    let visible = app.visible();
    let rows: Vec<Row> = visible
        .iter()
        .map(|r| {
            let (text, height) = if app.is_expanded(r.node) {
                let mut lines = vec![Line::from(format!("▾ {}", r.frames.first().map_or("", |s| s)))];
                lines.extend(r.frames.iter().skip(1).map(|c| Line::from(format!("    ← {c}"))));
                let h = lines.len() as u16;
                (Text::from(lines), h)
            } else {
                let mut l = String::from("▸ ");
                for (i, fr) in r.frames.iter().take(4).enumerate() {
                    if i > 0 {
                        l.push_str(" ← ");
                    }
                    l.push_str(fr);
                }
                if r.frames.len() > 4 {
                    l.push_str(&format!(" ← … (+{})", r.frames.len() - 4));
                }
                (Text::from(l), 1)
            };
            let instr = app.snapshot.instr_share(r).map_or("     -".to_string(), |x| format!("{:5.1}%", 100.0 * x));
            Row::new(vec![
                Cell::from(instr),
                Cell::from(pct(r.self_count, total)),
                Cell::from(pct(r.total_count, total)),
                Cell::from(format!("{:>8}", r.self_count)),
                Cell::from(format!("{:>8}", r.total_count)),
                Cell::from(text),
            ])
            .height(height)
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(["instr", "self", "total", "self#", "total#", "context (leaf ← callers)"])
            .style(Style::new().add_modifier(Modifier::REVERSED)),
    )
    .row_highlight_style(Style::new().add_modifier(Modifier::BOLD).add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected(Some(app.selected));
    f.render_stateful_widget(table, body, &mut state);

    let status_text = Text::from(vec![
        Line::from(format!(
            "{:.0} samples/s | {} samples | dropped {} | event {} | branches {} | contexts {} (folded {})",
            s.samples_per_s, s.samples, s.dropped, s.event, s.branches, s.nodes, s.folded
        )),
        Line::from(format!(
            "stack depth: mean {:.1}, {:.0}% of samples have <= 2 frames{}; {} stacks cut at a return address after no call ([truncated])",
            s.depth_mean,
            100.0 * s.shallow,
            if s.shallow > 0.5 { " (frame-pointer chains look broken: build with -fno-omit-frame-pointer)" } else { "" },
            s.truncated
        )),
    ]);
    f.render_widget(Paragraph::new(status_text).reversed(), status);
}
