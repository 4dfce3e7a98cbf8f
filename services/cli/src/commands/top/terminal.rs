//! The terminal while `mgpu top` runs full screen: raw mode and the alternate screen on entry,
//! and both given back on every way out — a normal return, an error (the guard's drop), a
//! panic (the hook restores before the message prints) — plus the keyboard, read on a thread
//! of its own since crossterm's reads block.

use std::io::{Stdout, Write};
use std::sync::Once;

use anyhow::{Context as _, Result};
use crossterm::event::Event;
use crossterm::{cursor, execute, terminal};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::mpsc;

pub type Screen = Terminal<CrosstermBackend<Stdout>>;

/// Holds the terminal in full-screen mode; dropping it gives the terminal back.
pub struct FullScreen {
    pub screen: Screen,
}

impl FullScreen {
    pub fn enter() -> Result<FullScreen> {
        install_panic_hook();
        terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
        // From here on, leaving restores: even a failure to enter the alternate screen.
        let guard = RawGuard;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )
        .context("cannot switch to the alternate screen")?;
        let screen = Terminal::new(CrosstermBackend::new(std::io::stdout()))
            .context("cannot draw on the terminal")?;
        std::mem::forget(guard);
        Ok(FullScreen { screen })
    }
}

impl Drop for FullScreen {
    fn drop(&mut self) {
        restore();
    }
}

/// Restores on drop until [`FullScreen`] takes over.
struct RawGuard;

impl Drop for RawGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves the alternate screen, shows the cursor and ends raw mode. Errors are ignored: this
/// runs on the way out, where the terminal may already be gone (a hang-up).
pub fn restore() {
    let mut out = std::io::stdout();
    let _ = execute!(out, terminal::LeaveAlternateScreen, cursor::Show);
    let _ = out.flush();
    let _ = terminal::disable_raw_mode();
}

/// A panic's message printed inside the alternate screen would vanish with it, and in raw
/// mode the shell afterwards would be unusable: the terminal is restored first.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// The terminal's events (keys, resizes) as they come. The reading thread ends when the
/// receiver is dropped and the next event comes, or when the terminal cannot be read; it is
/// otherwise left blocked in its read when the command ends, which the process's exit ends.
pub fn events() -> mpsc::UnboundedReceiver<Event> {
    let (sender, receiver) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while let Ok(event) = crossterm::event::read() {
            if sender.send(event).is_err() {
                break;
            }
        }
    });
    receiver
}
