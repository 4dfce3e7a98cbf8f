//! Which key does what in `mgpu top`: a key press, read in the screen's current mode, becomes
//! an [`Action`]. Pure: the model decides what an action changes.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    /// Between the nodes and the queue.
    SwitchPane,
    /// The selected job's details.
    Show,
    /// The selected job's live output.
    Log,
    Cancel,
    Hold,
    Release,
    /// Start typing a filter.
    Filter,
    /// A character typed into the filter.
    Type(char),
    Erase,
    /// Keep the filter typed so far.
    Accept,
    /// Close what is open (a pane, a prompt), or clear the filter.
    Dismiss,
    Yes,
    No,
    Quit,
}

/// What the screen is doing, as far as keys are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMode {
    /// Browsing the nodes and the queue.
    Normal,
    /// Typing a filter.
    Typing,
    /// Asking whether to cancel a job.
    Confirm,
    /// A job's details or output is open.
    Overlay,
}

/// The action `key` asks for in `mode`; None for keys that mean nothing there.
pub fn action(mode: KeyMode, key: &KeyEvent) -> Option<Action> {
    // Terminals that report releases would otherwise act twice per key.
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let control = key.modifiers.contains(KeyModifiers::CONTROL);
    // In raw mode Ctrl+C is a key like any other, not a signal: it quits from anywhere.
    if control && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('d')) {
        return Some(Action::Quit);
    }
    match mode {
        KeyMode::Normal => normal(key.code, control),
        KeyMode::Typing => typing(key.code, control),
        KeyMode::Confirm => match key.code {
            KeyCode::Char('y' | 'Y') => Some(Action::Yes),
            KeyCode::Char('n' | 'N') | KeyCode::Esc | KeyCode::Char('q') => Some(Action::No),
            _ => None,
        },
        KeyMode::Overlay => match key.code {
            KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q') => Some(Action::Dismiss),
            code => movement(code, control),
        },
    }
}

fn normal(code: KeyCode, control: bool) -> Option<Action> {
    match code {
        KeyCode::Char('q') => Some(Action::Quit),
        KeyCode::Esc => Some(Action::Dismiss),
        KeyCode::Tab | KeyCode::BackTab => Some(Action::SwitchPane),
        KeyCode::Enter => Some(Action::Show),
        KeyCode::Char('l') if !control => Some(Action::Log),
        KeyCode::Char('c') => Some(Action::Cancel),
        KeyCode::Char('h') if !control => Some(Action::Hold),
        KeyCode::Char('r') => Some(Action::Release),
        KeyCode::Char('/') => Some(Action::Filter),
        code => movement(code, control),
    }
}

fn movement(code: KeyCode, control: bool) -> Option<Action> {
    match code {
        KeyCode::Up | KeyCode::Char('k') => Some(Action::Up),
        KeyCode::Down | KeyCode::Char('j') => Some(Action::Down),
        KeyCode::PageUp => Some(Action::PageUp),
        KeyCode::PageDown => Some(Action::PageDown),
        // Ctrl+B / Ctrl+F page as in less and vi.
        KeyCode::Char('b') if control => Some(Action::PageUp),
        KeyCode::Char('f') if control => Some(Action::PageDown),
        KeyCode::Home | KeyCode::Char('g') => Some(Action::Top),
        KeyCode::End | KeyCode::Char('G') => Some(Action::Bottom),
        _ => None,
    }
}

fn typing(code: KeyCode, control: bool) -> Option<Action> {
    match code {
        KeyCode::Enter => Some(Action::Accept),
        KeyCode::Esc => Some(Action::Dismiss),
        KeyCode::Backspace => Some(Action::Erase),
        // Ctrl+U clears the line, as in a shell.
        KeyCode::Char('u') if control => Some(Action::Dismiss),
        KeyCode::Char(c) if !control && !c.is_control() => Some(Action::Type(c)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn ctrl(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    #[test]
    fn browsing_keys() {
        let normal = |code| action(KeyMode::Normal, &key(code));
        assert_eq!(normal(KeyCode::Char('j')), Some(Action::Down));
        assert_eq!(normal(KeyCode::Down), Some(Action::Down));
        assert_eq!(normal(KeyCode::Char('k')), Some(Action::Up));
        assert_eq!(normal(KeyCode::Enter), Some(Action::Show));
        assert_eq!(normal(KeyCode::Char('l')), Some(Action::Log));
        assert_eq!(normal(KeyCode::Char('c')), Some(Action::Cancel));
        assert_eq!(normal(KeyCode::Char('h')), Some(Action::Hold));
        assert_eq!(normal(KeyCode::Char('r')), Some(Action::Release));
        assert_eq!(normal(KeyCode::Char('/')), Some(Action::Filter));
        assert_eq!(normal(KeyCode::Char('q')), Some(Action::Quit));
        assert_eq!(normal(KeyCode::Tab), Some(Action::SwitchPane));
        assert_eq!(normal(KeyCode::Char('x')), None);
    }

    #[test]
    fn ctrl_c_quits_in_every_mode() {
        for mode in [
            KeyMode::Normal,
            KeyMode::Typing,
            KeyMode::Confirm,
            KeyMode::Overlay,
        ] {
            assert_eq!(action(mode, &ctrl('c')), Some(Action::Quit), "{mode:?}");
        }
    }

    #[test]
    fn typed_letters_are_text_in_a_filter_not_commands() {
        let typing = |code| action(KeyMode::Typing, &key(code));
        assert_eq!(typing(KeyCode::Char('q')), Some(Action::Type('q')));
        assert_eq!(typing(KeyCode::Char('c')), Some(Action::Type('c')));
        assert_eq!(typing(KeyCode::Backspace), Some(Action::Erase));
        assert_eq!(typing(KeyCode::Enter), Some(Action::Accept));
        assert_eq!(typing(KeyCode::Esc), Some(Action::Dismiss));
    }

    #[test]
    fn a_confirmation_takes_only_yes_or_no() {
        let confirm = |code| action(KeyMode::Confirm, &key(code));
        assert_eq!(confirm(KeyCode::Char('y')), Some(Action::Yes));
        assert_eq!(confirm(KeyCode::Char('n')), Some(Action::No));
        assert_eq!(confirm(KeyCode::Esc), Some(Action::No));
        assert_eq!(confirm(KeyCode::Char('c')), None);
        assert_eq!(confirm(KeyCode::Enter), None);
    }

    #[test]
    fn releases_are_ignored() {
        let release = KeyEvent::new_with_kind(
            KeyCode::Char('q'),
            KeyModifiers::NONE,
            KeyEventKind::Release,
        );
        assert_eq!(action(KeyMode::Normal, &release), None);
    }
}
