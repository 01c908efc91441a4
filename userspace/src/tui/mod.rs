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
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(keep_worker_panics_in_the_log);
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

/// Wraps the panic hook (after `ratatui::try_init`'s, which restores the terminal): a panic on
/// a decode worker thread ([`etm_session::WORKER_THREAD_PREFIX`]), which the pool catches and
/// counts (`decode.worker_failures`), goes to the log instead of tearing down the view and
/// printing over it; every other panic goes to the hook before.
fn keep_worker_panics_in_the_log() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name().is_some_and(|n| n.starts_with(etm_session::WORKER_THREAD_PREFIX)) {
            log::error!("decode worker: {info}");
        } else {
            prev(info);
        }
    }));
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
            let x = app.snapshot.instr_of(r);
            let instr = x.map_or("     -".to_string(), |x| format!("{:5.1}%", 100.0 * x.share));
            let per_call = |v: Option<f64>| v.map_or_else(|| format!("{:>8}", "-"), |v| format!("{v:>8.1}"));
            Row::new(vec![
                Cell::from(instr),
                Cell::from(per_call(x.and_then(|x| x.self_per_call))),
                Cell::from(per_call(x.and_then(|x| x.inclusive_per_call))),
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
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(["instr", "ins/call", "incl/call", "self", "total", "self#", "total#", "context (leaf ← callers)"])
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

#[cfg(test)]
mod tests {
    use super::app::{App, ContextRow, ExactFigures, Key, Snapshot};
    use ratatui::{Terminal, backend::TestBackend};

    /// A decode worker's panic skips the hook before (the terminal restore and the message on
    /// stderr); another thread's goes to it.
    #[test]
    fn worker_panics_stay_in_the_log() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s = seen.clone();
        let orig = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(n) = std::thread::current().name().filter(|n| n.starts_with("hook-probe") || n.starts_with("etm-decode-"))
            {
                s.lock().unwrap().push(n.to_string());
            }
            orig(info);
        }));
        super::keep_worker_panics_in_the_log();
        for name in [format!("{}7", etm_session::WORKER_THREAD_PREFIX), "hook-probe".to_string()] {
            let h = std::thread::Builder::new().name(name).spawn(|| panic!("probe")).unwrap();
            assert!(h.join().is_err());
        }
        assert_eq!(*seen.lock().unwrap(), vec!["hook-probe".to_string()]);
    }

    fn screen(app: &App) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(120, 10)).unwrap();
        t.draw(|f| super::render(f, app)).unwrap();
        let b = t.backend().buffer();
        (0..b.area.height).map(|y| (0..b.area.width).map(|x| b[(x, y)].symbol()).collect::<String>()).collect()
    }

    fn row(node: u32, self_count: u64, frames: &[&str]) -> ContextRow {
        ContextRow { node, self_count, total_count: self_count, frames: frames.iter().map(|f| f.to_string()).collect() }
    }

    /// The exact columns beside the sample columns: a leaf function's instruction share and
    /// its instructions per call (self, inclusive), `-` where the trace has none; `i` ranks by
    /// the share and back.
    #[test]
    fn exact_columns_and_ranking() {
        let mut s = Snapshot {
            total: 10,
            rows: vec![row(1, 6, &["hot1", "main"]), row(2, 3, &["hot2", "main"]), row(3, 1, &["cold", "main"])],
            ..Default::default()
        };
        s.instr.insert(
            "hot1".into(),
            ExactFigures { share: 0.25, complete_calls: 40, self_per_call: Some(12.5), inclusive_per_call: Some(30.0) },
        );
        s.instr.insert("hot2".into(), ExactFigures { share: 0.5, ..Default::default() });
        let mut app = App::default();
        app.set_snapshot(s);
        let lines = screen(&app);
        let head = lines.iter().find(|l| l.contains("ins/call")).expect("header");
        assert!(head.contains("incl/call") && head.find("instr") < head.find("self"), "{head}");
        let line = |leaf: &str, lines: &[String]| -> String {
            lines.iter().find(|l| l.contains(&format!("▸ {leaf} ←"))).unwrap_or_else(|| panic!("{leaf}: {lines:#?}")).clone()
        };
        let words = |l: String| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(words(line("hot1", &lines))[..5], ["25.0%", "12.5", "30.0", "60.0%", "60.0%"]);
        assert_eq!(words(line("hot2", &lines))[..4], ["50.0%", "-", "-", "30.0%"]);
        assert_eq!(words(line("cold", &lines))[..4], ["-", "-", "-", "10.0%"]);
        // Sample order, then instruction order with `i`, then back.
        let order = |lines: &[String]| -> Vec<usize> {
            ["hot1", "hot2", "cold"].iter().map(|f| lines.iter().position(|l| l.contains(&format!("▸ {f} ←"))).unwrap()).collect()
        };
        let o = order(&lines);
        assert!(o[0] < o[1] && o[1] < o[2], "{lines:#?}");
        app.on_key(Key::Char('i'));
        let lines = screen(&app);
        assert!(lines[1].contains("sort: instructions"), "{}", lines[1]);
        let o = order(&lines);
        assert!(o[1] < o[0] && o[0] < o[2], "{lines:#?}");
        app.on_key(Key::Char('i'));
        assert!(screen(&app)[1].contains("sort: self"));
    }
}
