//! The two panes, drawn line by line: the nodes pane (a line per GPU: its type, utilisation
//! and memory, its temperature and power where NVML reads them, the job holding it and whose it
//! is, paused and drained marks) and the queue
//! (running jobs, then waiting ones with their effective priority and why they wait; a running
//! job warned that its GPUs sit idle says `idle`).
//! The user's own jobs carry a `*` and a colour; the selected line a `>`.

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState, Run};
use mgpu_protocol::node::GpuStatus;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use super::format;
use super::layout::visible_lines;
use super::model::{Cursor, Mode, Model, Pane};
use super::rows::{GpuLine, JobLine, NodeState, is_mine, queued_at};
use super::widgets::{LineWriter, percent_bar, title};

fn mine_style() -> Style {
    Style::default()
        .fg(Color::Cyan)
        .add_modifier(Modifier::BOLD)
}

fn dim() -> Style {
    Style::default().add_modifier(Modifier::DIM)
}

/// The first line to show so that the selection is on screen (the model keeps this; a frame
/// drawn before it settled must still not lose the selection).
fn first_shown(cursor: &Cursor, height: usize) -> usize {
    let height = height.max(1);
    if cursor.index < cursor.offset {
        cursor.index
    } else if cursor.index >= cursor.offset + height {
        cursor.index + 1 - height
    } else {
        cursor.offset
    }
}

fn focused(model: &Model, pane: Pane) -> bool {
    model.focus == pane && !matches!(model.mode(), Mode::Detail(_) | Mode::Log(_))
}

fn filter_note(model: &Model) -> String {
    if model.filter.is_empty() {
        String::new()
    } else {
        format!(" · filter: {}", model.filter.text())
    }
}

/// Column widths of the nodes pane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeColumns {
    name: u16,
    bar: u16,
    /// The `TEMP` and `POWER` columns are drawn.
    sensors: bool,
}

/// Width of the `TEMP` (`100°C`) and `POWER` (`1000W`) columns each.
const SENSOR: u16 = 5;

/// Columns left for the notes before the temperature and power columns give way.
const NOTE_ROOM: u16 = 12;

impl NodeColumns {
    /// The columns for a pane `width` wide: wide bars from 120 columns; temperature and power
    /// when some GPU reports them (`reported`) and the line still leaves [`NOTE_ROOM`] for
    /// notes, with narrow bars if that is what makes them fit; without them otherwise, so a
    /// narrow terminal shows the same columns as for GPUs that report neither.
    fn fit(width: u16, name: u16, reported: bool) -> NodeColumns {
        let bar = if width >= 120 { 12 } else { 7 };
        let plain = NodeColumns {
            name,
            bar,
            sensors: false,
        };
        if !reported {
            return plain;
        }
        [bar, 7]
            .into_iter()
            .map(|bar| NodeColumns {
                name,
                bar,
                sensors: true,
            })
            .find(|columns| columns.note_x().saturating_add(NOTE_ROOM) <= width)
            .unwrap_or(plain)
    }

    /// Where the notes start: the widths of the columns before them, each and its gap.
    fn note_x(&self) -> u16 {
        let fixed: u16 = [1, self.name, 8, 3, 14, self.bar + 5, self.bar + 12, 10, 10]
            .iter()
            .map(|width| width + 1)
            .sum();
        if self.sensors {
            fixed + 2 * (SENSOR + 1)
        } else {
            fixed
        }
    }
}

pub(super) fn nodes(model: &Model, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let rows = &model.rows;
    let focused = focused(model, Pane::Nodes);
    let text = format!(
        "Nodes · {} · {} shown{}",
        format::count(rows.summary.nodes, "node"),
        format::count(rows.gpus.len(), "GPU"),
        filter_note(model)
    );
    title(area, &text, focused, buf);
    // Wide enough for the longest name (node names are short, but some sites use FQDNs).
    let longest = model.data.nodes.iter().map(|n| n.node.len()).max();
    let name = u16::try_from(longest.unwrap_or(4).clamp(4, 24)).unwrap_or(24);
    let columns = NodeColumns::fit(area.width, name, rows.sensors);
    let mut head = LineWriter {
        buf: &mut *buf,
        x: area.x,
        y: area.y + 1,
        right: area.right(),
    };
    let bold = Style::default().add_modifier(Modifier::BOLD);
    head.cell("", 1, bold);
    head.cell("NODE", columns.name, bold);
    head.cell("STATE", 8, bold);
    head.number("GPU", 3, bold);
    head.cell("TYPE", 14, bold);
    head.cell("UTIL", columns.bar + 5, bold);
    head.cell("MEMORY (GiB)", columns.bar + 12, bold);
    if columns.sensors {
        head.number("TEMP", SENSOR, bold);
        head.number("POWER", SENSOR, bold);
    }
    head.cell("JOB", 10, bold);
    head.cell("USER", 10, bold);
    head.rest("NOTE", bold);
    if rows.gpus.is_empty() && area.height > 2 {
        let what = if model.data.nodes.is_empty() {
            "No node has reported yet."
        } else {
            "No GPU matches the filter."
        };
        buf.set_stringn(area.x + 2, area.y + 2, what, usize::from(area.width), dim());
        return;
    }
    let height = visible_lines(area);
    let offset = first_shown(&model.nodes_cursor, height);
    for (n, (at, line)) in rows
        .gpus
        .iter()
        .enumerate()
        .skip(offset)
        .take(height)
        .enumerate()
    {
        let y = area.y + 2 + u16::try_from(n).unwrap_or(0);
        let selected = at == model.nodes_cursor.index;
        gpu_line(model, line, &columns, selected, (area, y), buf);
        if selected && focused {
            buf.set_style(
                Rect::new(area.x, y, area.width, 1),
                Style::default().add_modifier(Modifier::REVERSED),
            );
        }
    }
}

fn gpu_line(
    model: &Model,
    line: &GpuLine,
    columns: &NodeColumns,
    selected: bool,
    (area, y): (Rect, u16),
    buf: &mut Buffer,
) {
    let Some(node) = model.data.nodes.get(line.node) else {
        return;
    };
    let state = model
        .rows
        .node_states
        .get(line.node)
        .copied()
        .unwrap_or(NodeState::Offline);
    let base = match state {
        NodeState::Offline => dim(),
        NodeState::Drained | NodeState::Draining => Style::default().fg(Color::Yellow),
        NodeState::Online => Style::default(),
    };
    let mut out = LineWriter {
        buf,
        x: area.x,
        y,
        right: area.right(),
    };
    out.cell(if selected { ">" } else { " " }, 1, base);
    let (name, state_name) = if line.first {
        (node.node.as_str(), state.name())
    } else {
        ("", "")
    };
    out.cell(name, columns.name, base.add_modifier(Modifier::BOLD));
    out.cell(state_name, 8, base);
    let Some(gpu) = line.gpu.and_then(|at| node.gpus.get(at)) else {
        out.number("-", 3, base);
        out.rest("no GPUs", dim());
        return;
    };
    out.number(&gpu.index.to_string(), 3, base);
    out.cell(format::gpu_kind(gpu), 14, base);
    let util = f64::from(gpu.utilization_pct) / 100.0;
    out.cell(&percent_bar(util, columns.bar), columns.bar + 5, base);
    let used = gpu.memory_used_mib as f64 / gpu.memory_total_mib.max(1) as f64;
    let memory = format!(
        "{} {:>5}/{:<5}",
        format::bar(used, usize::from(columns.bar)),
        format::gib(gpu.memory_used_mib),
        format::gib(gpu.memory_total_mib)
    );
    out.cell(&memory, columns.bar + 12, base);
    if columns.sensors {
        out.number(&format::celsius(gpu.temperature_c), SENSOR, base);
        out.number(&format::watts(gpu.power_w), SENSOR, base);
    }
    let job = line.job.and_then(|at| model.data.jobs.get(at));
    let job_style = match job {
        Some(job) if is_mine(&model.me, job) => mine_style(),
        _ => base,
    };
    out.cell(job.map_or("-", |j| j.id.short()), 10, job_style);
    out.cell(job.map_or("", |j| j.user.as_str()), 10, job_style);
    let notes = notes(line, gpu, state, node.sent_at, model.now);
    out.rest(&notes, Style::default().fg(Color::Yellow));
}

/// A GPU line's notes: `paused`, `+N sharing`, `… GiB not mgpu's`, `silent for …`.
fn notes(
    line: &GpuLine,
    gpu: &GpuStatus,
    state: NodeState,
    sent_at: Timestamp,
    now: Timestamp,
) -> String {
    let mut notes = Vec::new();
    if line.paused {
        notes.push("paused".to_owned());
    }
    if line.sharers > 0 {
        notes.push(format!("+{} sharing", line.sharers));
    }
    let foreign: u64 = gpu.foreign_processes.iter().map(|p| p.used_mib).sum();
    if foreign > 0 {
        notes.push(format!(
            "{} GiB not mgpu's{}",
            format::gib(foreign),
            foreign_owners(gpu)
        ));
    }
    if line.first && state == NodeState::Offline {
        notes.push(format!("silent for {}", format::since(sent_at, now)));
    }
    notes.join(", ")
}

/// Whose processes use a GPU outside mgpu, where the agent could tell: ` (bob, carol)`; the
/// first two by name, then how many more (one line has little room).
fn foreign_owners(gpu: &GpuStatus) -> String {
    let mut owners: Vec<&str> = gpu
        .foreign_processes
        .iter()
        .filter_map(|p| p.user.as_deref())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    match owners.len() {
        0 => String::new(),
        1 | 2 => format!(" ({})", owners.join(", ")),
        more => format!(" ({}, {} +{})", owners[0], owners[1], more - 2),
    }
}

pub(super) fn jobs(model: &Model, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let rows = &model.rows;
    let focused = focused(model, Pane::Jobs);
    let text = format!(
        "Queue · {} running, {} queued · {} shown{}",
        rows.summary.running,
        rows.summary.queued,
        rows.jobs.len(),
        filter_note(model)
    );
    title(area, &text, focused, buf);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut head = LineWriter {
        buf: &mut *buf,
        x: area.x,
        y: area.y + 1,
        right: area.right(),
    };
    head.cell("", 2, bold);
    head.cell("ID", 10, bold);
    head.cell("USER", 10, bold);
    head.cell("NAME", 14, bold);
    head.cell("STATE", 7, bold);
    head.number("PRIO", 4, bold);
    head.number("EFF", 6, bold);
    head.number("GPUS", 4, bold);
    head.cell("NODE:GPUS", 12, bold);
    head.number("TIME", 7, bold);
    head.rest("REASON", bold);
    if rows.jobs.is_empty() && area.height > 2 {
        let what = if model.data.jobs.is_empty() {
            "No queued or running jobs."
        } else {
            "No job matches the filter."
        };
        buf.set_stringn(area.x + 2, area.y + 2, what, usize::from(area.width), dim());
        return;
    }
    let height = visible_lines(area);
    let offset = first_shown(&model.jobs_cursor, height);
    for (n, (at, line)) in rows
        .jobs
        .iter()
        .enumerate()
        .skip(offset)
        .take(height)
        .enumerate()
    {
        let Some(job) = model.data.jobs.get(line.job) else {
            continue;
        };
        let y = area.y + 2 + u16::try_from(n).unwrap_or(0);
        let selected = at == model.jobs_cursor.index;
        job_line(model, job, line, selected, (area, y), buf);
        if selected && focused {
            buf.set_style(
                Rect::new(area.x, y, area.width, 1),
                Style::default().add_modifier(Modifier::REVERSED),
            );
        }
    }
}

fn job_line(
    model: &Model,
    job: &JobRecord,
    line: &JobLine,
    selected: bool,
    (area, y): (Rect, u16),
    buf: &mut Buffer,
) {
    let style = if line.mine {
        mine_style()
    } else {
        Style::default()
    };
    let mut out = LineWriter {
        buf,
        x: area.x,
        y,
        right: area.right(),
    };
    // Two marks before the id: `>` selected, `*` yours.
    let marks = format!(
        "{}{}",
        if selected { '>' } else { ' ' },
        if line.mine { '*' } else { ' ' }
    );
    out.cell(&marks, 2, style);
    out.cell(job.id.short(), 10, style);
    out.cell(&job.user, 10, style);
    out.cell(&job.spec.display_name(), 14, style);
    out.cell(job.state.name(), 7, style);
    out.number(&job.spec.priority.to_string(), 4, style);
    let effective = line.effective.map_or("-".to_owned(), |e| e.to_string());
    out.number(&effective, 6, style);
    out.number(&job.spec.gpus.to_string(), 4, style);
    let (place, time, reason) = match &job.state {
        JobState::Running(run) => {
            let place = format::placement(&run.placement);
            let reason = running_note(run);
            let since = run.started_at.unwrap_or(run.assigned_at);
            (place, format::since(since, model.now), reason.to_owned())
        }
        JobState::Queued(waiting) => {
            let reason = match &waiting.held_by {
                Some(by) => format!("held by {by}"),
                None => waiting.reason.describe().to_owned(),
            };
            let waited = format::since(queued_at(job), model.now);
            ("-".to_owned(), waited, reason)
        }
        _ => ("-".to_owned(), String::new(), String::new()),
    };
    out.cell(&place, 12, style);
    out.number(&time, 7, style);
    let reason_style = match &job.state {
        JobState::Queued(w) if w.held_by.is_some() => style.fg(Color::Yellow),
        JobState::Running(run) if running_note(run) == IDLE => style.fg(Color::Yellow),
        _ => style,
    };
    out.rest(&reason, reason_style);
}

/// The REASON of a running job that is warned for idle GPUs (`mgpu show` says until when).
const IDLE: &str = "idle";

/// What the REASON column says of a running job: being cancelled, not started yet, or warned
/// that its GPUs sit idle; nothing while it simply runs.
fn running_note(run: &Run) -> &'static str {
    match (&run.cancel_requested_by, run.started_at) {
        (Some(_), _) => "cancelling",
        (None, None) => "starting",
        (None, Some(_)) if run.idle_warning.is_some() => IDLE,
        (None, Some(_)) => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_and_power_fit_where_the_notes_keep_their_room() {
        let fit = NodeColumns::fit;
        let columns = |bar, sensors| NodeColumns {
            name: 7,
            bar,
            sensors,
        };
        assert_eq!(fit(120, 7, false), columns(12, false));
        assert_eq!(fit(100, 7, false), columns(7, false));
        // At 120 the bars narrow to make room; from 127 both fit.
        assert_eq!(fit(120, 7, true), columns(7, true));
        assert_eq!(fit(126, 7, true), columns(7, true));
        assert_eq!(fit(127, 7, true), columns(12, true));
        assert_eq!(fit(116, 7, true), columns(7, false));
        // A long node name leaves no room at 120.
        assert!(!fit(120, 24, true).sensors);
        assert_eq!(columns(7, true).note_x() + NOTE_ROOM, 117);
        assert_eq!(columns(12, false).note_x(), 103);
    }

    #[test]
    fn a_running_job_warned_for_idle_gpus_says_idle() {
        use crate::commands::top::screen::test_data::running;
        let JobState::Running(mut run) = running("n1", &[0]) else {
            panic!("the fixture runs")
        };
        assert_eq!(running_note(&run), "");
        let now = mgpu_protocol::now();
        run.idle_warning = Some(mgpu_protocol::idle::IdleWarning {
            idle_since: now,
            warned_at: now,
            action: mgpu_protocol::idle::IdleAction::Requeue,
            action_from: now,
        });
        assert_eq!(running_note(&run), "idle");
        run.cancel_requested_by = Some("alice".into());
        assert_eq!(
            running_note(&run),
            "cancelling",
            "what is being done comes first"
        );
    }

    #[test]
    fn foreign_use_names_its_owners_briefly() {
        let process = |user: Option<&str>| mgpu_protocol::node::ForeignProcess {
            pid: 1,
            used_mib: 1024,
            user: user.map(str::to_owned),
        };
        let mut gpu = GpuStatus {
            index: 0,
            uuid: "GPU-0".into(),
            name: "H100".into(),
            gpu_type: None,
            memory_total_mib: 81_920,
            memory_used_mib: 0,
            utilization_pct: 0,
            temperature_c: None,
            power_w: None,
            foreign_processes: vec![process(None)],
        };
        assert_eq!(foreign_owners(&gpu), "");
        gpu.foreign_processes = vec![process(Some("bob")), process(Some("bob"))];
        assert_eq!(foreign_owners(&gpu), " (bob)");
        for name in ["dave", "carol", "erin"] {
            gpu.foreign_processes.push(process(Some(name)));
        }
        assert_eq!(foreign_owners(&gpu), " (bob, carol +2)");
    }
}
