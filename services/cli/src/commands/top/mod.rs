//! `mgpu top`: the whole cluster live, full screen — every node and GPU with the job on it,
//! the queue below with why each job waits, the user's own jobs marked — and keys to look
//! closer or act (`enter`, `l`, `c`, `h`, `r`, `/`, `q`).
//!
//! This module owns the command's I/O: the arguments, the loop that feeds the model what
//! arrives (`feed`: buckets and heartbeats; `terminal`: keys and resizes) and carries out
//! what it asks (`effects`: cancel, hold, release, follow a log), and the drawing pace. The
//! model and the drawing are pure and live in [`screen`], which the library also exports as
//! `mgpu_cli::top` for the benchmarks.
//!
//! Redraws: at once after a key or a resize, otherwise at most [`FRAMES_PER_SECOND`] times a
//! second however fast records and heartbeats arrive.

mod effects;
mod feed;
pub mod screen;
mod terminal;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use crossterm::event::Event;
use futures::future::LocalBoxFuture;
use futures::stream::{BoxStream, FuturesUnordered, SelectAll};
use futures::{FutureExt, StreamExt};
use screen::model::{Effect, Input, Me, Model};
use screen::view;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::client::session::{ConnectionArgs, Session};
use crate::commands::hold;
use crate::model::snapshot::Snapshot;

/// Redraws a second at most while data streams in (keys redraw at once).
const FRAMES_PER_SECOND: u32 = 4;

/// The frame `--once` draws when it is not printing to a terminal.
const PRINTED_SIZE: (u16, u16) = (120, 40);

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame and exit (for scripts and tests).
    #[arg(long)]
    pub once: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &TopArgs) -> Result<ExitCode> {
    if args.once {
        let session = Session::connect(connection).await?;
        return once(&session).await;
    }
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!("mgpu top needs a terminal; `mgpu top --once` prints one frame");
    }
    let session = Session::connect(connection).await?;
    live(&session).await
}

fn me(session: &Session) -> Me {
    Me {
        user: session.user.clone(),
        key: session.key.public_key(),
    }
}

/// One frame from what JetStream holds now, printed as text.
async fn once(session: &Session) -> Result<ExitCode> {
    let snapshot = Snapshot::read(&session.js).await?;
    let (cols, rows) = printed_size();
    let mut model = Model::new(me(session), mgpu_protocol::now(), (cols, rows));
    model.update(Input::Policy(snapshot.cluster.policy));
    model.update(Input::Usage(snapshot.cluster.usage));
    for (node, marks) in snapshot.cluster.admin {
        model.update(Input::Marks {
            node,
            marks: Some(marks),
        });
    }
    for beat in snapshot.nodes {
        model.update(Input::heartbeat(beat));
    }
    for job in snapshot.jobs {
        model.update(Input::job(job));
    }
    model.settle();
    let mut buf = view::blank((cols, rows));
    view::render(&model, buf.area, &mut buf);
    let mut out = std::io::stdout().lock();
    out.write_all(view::to_text(&buf).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The size of the frame `--once` prints: `COLUMNS` and `LINES` where set (as for curses
/// programs), else the terminal's less a row for the prompt that follows, else
/// [`PRINTED_SIZE`].
fn printed_size() -> (u16, u16) {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.trim().parse::<u16>().ok())
            .filter(|n| *n > 0)
    };
    let (cols, rows) = if std::io::stdout().is_terminal() {
        crossterm::terminal::size()
            .map(|(cols, rows)| (cols, rows.saturating_sub(1)))
            .unwrap_or(PRINTED_SIZE)
    } else {
        PRINTED_SIZE
    };
    (env("COLUMNS").unwrap_or(cols), env("LINES").unwrap_or(rows))
}

/// What the loop has going besides the model.
struct Loop<'a> {
    session: &'a Session,
    /// Requests under way (and the admin probe), each ending in an input.
    work: FuturesUnordered<LocalBoxFuture<'a, Input>>,
    /// The output of the job whose log pane is open.
    log: Option<BoxStream<'static, Input>>,
    /// When the screen was last drawn, and whether it is out of date.
    drawn: Instant,
    stale: bool,
    /// Draw at once (a key was pressed, the terminal resized).
    urgent: bool,
}

async fn live(session: &Session) -> Result<ExitCode> {
    // Before the terminal changes: from here on these end the loop, which gives it back.
    let (mut term, mut hangup, mut interrupt) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::hangup())?,
        signal(SignalKind::interrupt())?,
    );
    let mut full = terminal::FullScreen::enter()?;
    let size = full.screen.size()?;
    let mut model = Model::new(me(session), mgpu_protocol::now(), (size.width, size.height));
    let mut sources = sources(session);
    let mut events = terminal::events();
    let mut state = Loop {
        session,
        work: FuturesUnordered::new(),
        log: None,
        drawn: Instant::now(),
        stale: true,
        urgent: true,
    };
    state
        .work
        .push(async move { feed::admin(session).await }.boxed_local());
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let frame = Duration::from_secs(1) / FRAMES_PER_SECOND;
    loop {
        let due = if state.urgent {
            Instant::now()
        } else {
            state.drawn + frame
        };
        let input = tokio::select! {
            // Checked first, so a flood of records never holds a frame back.
            biased;
            _ = term.recv() => break,
            _ = hangup.recv() => break,
            _ = interrupt.recv() => break,
            () = tokio::time::sleep_until(due), if state.stale => {
                draw(&mut full.screen, &mut model)?;
                state.drawn = Instant::now();
                (state.stale, state.urgent) = (false, false);
                continue;
            }
            event = events.recv() => match event {
                Some(event) => match terminal_input(event) {
                    Some(input) => {
                        state.urgent = true;
                        input
                    }
                    None => continue,
                },
                // The terminal is gone.
                None => break,
            },
            Some(input) = state.work.next(), if !state.work.is_empty() => input,
            input = next_of(&mut state.log) => match input {
                Some(input) => input,
                None => {
                    state.log = None;
                    continue;
                }
            },
            Some(input) = sources.next() => input,
            _ = ticks.tick() => Input::Tick(mgpu_protocol::now()),
        };
        state.stale = true;
        if !state.carry_out(model.update(input)) {
            break;
        }
    }
    drop(full);
    Ok(ExitCode::SUCCESS)
}

/// Everything read from the cluster, as one stream.
fn sources(session: &Session) -> SelectAll<BoxStream<'static, Input>> {
    let mut sources = SelectAll::new();
    sources.push(feed::jobs(session.js.clone()));
    sources.push(feed::pending(session.js.clone()));
    sources.push(feed::cluster(session.js.clone()));
    sources.push(feed::heartbeats(session));
    sources
}

/// What a terminal event means to the model.
fn terminal_input(event: Event) -> Option<Input> {
    match event {
        Event::Key(key) => Some(Input::Key(key)),
        Event::Resize(cols, rows) => Some(Input::Resize { cols, rows }),
        _ => None,
    }
}

/// The next input of an open log; never ready while none is open.
async fn next_of(log: &mut Option<BoxStream<'static, Input>>) -> Option<Input> {
    match log {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

fn draw(screen: &mut terminal::Screen, model: &mut Model) -> Result<()> {
    model.settle();
    screen.draw(|frame| view::render(model, frame.area(), frame.buffer_mut()))?;
    Ok(())
}

impl<'a> Loop<'a> {
    /// Starts what the model asked for; false once it asked to quit.
    fn carry_out(&mut self, effects: Vec<Effect>) -> bool {
        let session = self.session;
        for effect in effects {
            match effect {
                Effect::Quit => return false,
                Effect::Cancel(id) => self.work.push(effects::cancel(session, id).boxed_local()),
                Effect::Hold(id) => self
                    .work
                    .push(effects::hold(session, id, hold::Action::Hold).boxed_local()),
                Effect::Release(id) => self
                    .work
                    .push(effects::hold(session, id, hold::Action::Release).boxed_local()),
                Effect::FollowLog(id, subject) => {
                    self.log = Some(effects::follow_log(session.js.clone(), id, subject));
                }
                Effect::StopLog => self.log = None,
            }
        }
        true
    }
}
