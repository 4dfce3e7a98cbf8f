//! Whole frames drawn from a model, read as text the way a user reads the screen: the tests
//! of the header, the panes and what opens over them (tests only). Nothing imports this
//! module, so it may import every other.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use mgpu_protocol::Timestamp;
use mgpu_protocol::node::NodeHeartbeat;

use super::model::{Input, Model};
use super::test_data::{alice, heartbeat, job, nvml_heartbeat, queued, running};
use super::view::{blank, render, to_text};

/// The frame `model` draws at `width`×`height`, as text.
fn draw(model: &mut Model, width: u16, height: u16) -> String {
    model.settle();
    let mut buf = blank((width, height));
    render(model, buf.area, &mut buf);
    to_text(&buf)
}

fn press(model: &mut Model, code: KeyCode) {
    model.update(Input::Key(KeyEvent::new(code, KeyModifiers::NONE)));
}

#[test]
fn details_say_why_a_job_waits_and_whose_it_is() {
    let mut model = Model::new(alice(), mgpu_protocol::now(), (100, 24));
    let record = job("alice", "sweep", queued());
    model.update(Input::job(record.clone()));
    model.settle();
    press(&mut model, KeyCode::Enter);
    let text = draw(&mut model, 100, 24);
    assert!(text.contains(record.id.as_str()), "{text}");
    assert!(text.contains("alice (you)"), "{text}");
    assert!(text.contains("waiting for GPUs to become free"), "{text}");
    assert!(text.contains("sleep 300"), "{text}");
}

#[test]
fn the_log_shows_the_newest_lines_and_how_it_ended() {
    let mut model = Model::new(alice(), mgpu_protocol::now(), (100, 24));
    let record = job("alice", "sweep", queued());
    model.update(Input::job(record.clone()));
    model.settle();
    press(&mut model, KeyCode::Char('l'));
    let mut output = String::new();
    for n in 0..100 {
        output.push_str(&format!("line {n}\n"));
    }
    model.update(Input::Log {
        job: record.id.clone(),
        bytes: output.into_bytes(),
    });
    model.update(Input::LogEnded {
        job: record.id.clone(),
        note: "output ended".into(),
    });
    let text = draw(&mut model, 100, 24);
    assert!(text.contains("line 99"), "{text}");
    assert!(!text.contains("line 50\n"), "{text}");
    assert!(text.contains("— output ended —"), "{text}");
    press(&mut model, KeyCode::Char('g'));
    let text = draw(&mut model, 100, 24);
    assert!(text.contains("line 0\n"), "{text}");
}

#[test]
fn a_frame_shows_nodes_gpus_jobs_and_whose_they_are() {
    let mut model = Model::new(alice(), mgpu_protocol::now(), (120, 20));
    model.update(Input::heartbeat(heartbeat("node001", 2)));
    let train = job("alice", "train", running("node001", &[1]));
    let waiting = job("bob", "eval", queued());
    model.update(Input::job(train.clone()));
    model.update(Input::job(waiting.clone()));
    let text = draw(&mut model, 120, 20);
    assert!(text.contains("1 free, 1 used, 0 paused"), "{text}");
    assert!(text.contains("A100: 1 free, 1 used, 0 paused"), "{text}");
    let gpu1 = text
        .lines()
        .find(|l| l.contains(train.id.short()) && l.contains("A100"))
        .unwrap_or_default();
    assert!(gpu1.contains("alice") && gpu1.contains("10%"), "{text}");
    let queued_line = text
        .lines()
        .find(|l| l.contains(waiting.id.short()))
        .unwrap_or_default();
    assert!(
        queued_line.contains("waiting for GPUs to become free"),
        "{text}"
    );
    // Alice's own job is marked; the selected one too.
    let own = text
        .lines()
        .find(|l| l.contains(train.id.short()) && l.contains("running"))
        .unwrap_or_default();
    assert!(own.starts_with(">*"), "{text}");
}

/// The screen of `width`×20 columns after these heartbeats, as text.
fn nodes_frame(beats: &[NodeHeartbeat], width: u16, now: Timestamp) -> String {
    let mut model = Model::new(alice(), now, (width, 20));
    for beat in beats {
        model.update(Input::heartbeat(beat.clone()));
    }
    draw(&mut model, width, 20)
}

/// The GPU lines of model `model_name` with index `index` (node names show once).
fn gpu_row<'a>(text: &'a str, model_name: &str, index: u32) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.contains(model_name) && l.contains("/24.0"))
        .filter(|l| l.split_whitespace().any(|w| w == index.to_string()))
        .collect()
}

#[test]
fn gpus_show_their_temperature_and_power_where_nvml_reads_them() {
    let mut declared = heartbeat("node002", 1);
    declared.gpus[0].name = "L4".into();
    let now = mgpu_protocol::now();
    let text = nodes_frame(&[nvml_heartbeat("node001", 2), declared], 120, now);
    let head = text
        .lines()
        .find(|l| l.contains("NODE"))
        .unwrap_or_default();
    assert!(head.contains(" TEMP POWER JOB "), "{text}");
    // Right-aligned under their headings, in the column the heading ends in.
    let end_of = |line: &str, word: &str| {
        line.find(word)
            .map(|at| line[..at + word.len()].chars().count())
    };
    let gpu1 = gpu_row(&text, "A100", 1);
    assert_eq!(gpu1.len(), 1, "{text}");
    assert!(gpu1[0].contains(" 61°C  260W "), "{text}");
    assert_eq!(end_of(gpu1[0], "°C"), end_of(head, "TEMP"), "{text}");
    assert_eq!(end_of(gpu1[0], "260W"), end_of(head, "POWER"), "{text}");
    // A GPU that reports neither shows a dash in each.
    let l4 = gpu_row(&text, "L4", 0);
    assert_eq!(l4.len(), 1, "{text}");
    let dashes: Vec<usize> = l4[0]
        .char_indices()
        .filter(|(_, c)| *c == '-')
        .map(|(at, _)| l4[0][..=at].chars().count())
        .collect();
    assert!(
        dashes.contains(&end_of(head, "TEMP").unwrap_or(0)),
        "{text}"
    );
    assert!(
        dashes.contains(&end_of(head, "POWER").unwrap_or(0)),
        "{text}"
    );
    // The notes still have their room: the heading is on screen.
    assert!(head.ends_with("NOTE"), "{text}");
}

#[test]
fn without_readings_or_room_the_nodes_pane_is_as_before() {
    let now = mgpu_protocol::now();
    let declared = nodes_frame(&[heartbeat("node001", 2)], 120, now);
    assert!(
        !declared.contains("TEMP") && !declared.contains("°C"),
        "{declared}"
    );
    // Too narrow for them: the same frame as for GPUs that report neither.
    for width in [80, 100, 116] {
        let nvml = nodes_frame(&[nvml_heartbeat("node001", 2)], width, now);
        assert!(!nvml.contains("TEMP"), "{nvml}");
        assert_eq!(nvml, nodes_frame(&[heartbeat("node001", 2)], width, now));
    }
    // Wide enough for the wide bars as well.
    let wide = nodes_frame(&[nvml_heartbeat("node001", 2)], 140, now);
    assert!(
        wide.contains("TEMP POWER") && wide.contains("[|         ]"),
        "{wide}"
    );
}

#[test]
fn gpus_show_their_type_and_the_header_counts_by_type() {
    let now = mgpu_protocol::now();
    let mut typed = heartbeat("node001", 2);
    for gpu in &mut typed.gpus {
        gpu.name = "NVIDIA H100 80GB HBM3".into();
        gpu.gpu_type = Some("h100".into());
    }
    // An agent that reports no type: its model name stands in.
    let untyped = heartbeat("node002", 1);
    let text = nodes_frame(&[typed, untyped], 120, now);
    let head = text
        .lines()
        .find(|l| l.contains("NODE"))
        .unwrap_or_default();
    assert!(head.contains(" GPU TYPE "), "{text}");
    let typed_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" h100 ") && l.contains("/24.0"))
        .collect();
    assert_eq!(typed_lines.len(), 2, "{text}");
    assert!(!text.contains("NVIDIA H100"), "{text}");
    assert_eq!(gpu_row(&text, "A100", 0).len(), 1, "{text}");
    assert!(text.contains("A100: 1 free, 0 used, 0 paused"), "{text}");
    assert!(text.contains("h100: 2 free, 0 used, 0 paused"), "{text}");
}
