//! How `mgpu top` writes numbers for people: bars, memory sizes, temperatures and power,
//! waiting times, GPU lists and types.
//! Bars are ASCII (`[|||   ]`) so they read the same on any terminal and in a captured screen.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::job::Placement;
use mgpu_protocol::node::GpuStatus;

/// `[||||      ]` filled to `fraction` (0..=1) over `width` characters, brackets included.
pub fn bar(fraction: f64, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // Rounded up, so any use at all shows as one mark.
    let filled = ((fraction * inner as f64).ceil() as usize).min(inner);
    let mut out = String::with_capacity(width);
    out.push('[');
    out.extend(std::iter::repeat_n('|', filled));
    out.extend(std::iter::repeat_n(' ', inner - filled));
    out.push(']');
    out
}

/// `1 node`, `3 nodes`.
pub fn count(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// MiB as GiB with one decimal: `23.6`.
pub fn gib(mib: u64) -> String {
    format!("{:.1}", mib as f64 / 1024.0)
}

/// A GPU's temperature as `67°C`; `-` where none was read (declared GPUs).
pub fn celsius(temperature_c: Option<u32>) -> String {
    temperature_c.map_or_else(|| "-".to_owned(), |t| format!("{t}°C"))
}

/// A GPU's power draw as `250W`; `-` where none was read (declared GPUs).
pub fn watts(power_w: Option<u32>) -> String {
    power_w.map_or_else(|| "-".to_owned(), |w| format!("{w}W"))
}

/// Time from `then` to `now` as `4m05s`; zero when the clocks disagree about the order.
pub fn since(then: Timestamp, now: Timestamp) -> String {
    format_duration((now - then).to_std().unwrap_or(Duration::ZERO))
}

/// What a GPU is, short: its type as jobs ask for it (`h100`), or its model name where its
/// agent reports no type.
pub fn gpu_kind(gpu: &GpuStatus) -> &str {
    gpu.gpu_type.as_deref().unwrap_or(&gpu.name)
}

/// GPU indices as `0,1,3`.
pub fn indices(gpus: impl Iterator<Item = u32>) -> String {
    let mut out = String::new();
    for (n, gpu) in gpus.enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&gpu.to_string());
    }
    out
}

/// Where a job runs: `node001:0,1 node002:3`.
pub fn placement(placement: &Placement) -> String {
    placement
        .ranks()
        .map(|(_, node, shares)| format!("{node}:{}", indices(shares.iter().map(|s| s.index))))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_in_proportion() {
        assert_eq!(bar(0.0, 6), "[    ]");
        assert_eq!(bar(0.5, 6), "[||  ]");
        assert_eq!(bar(0.01, 6), "[|   ]");
        assert_eq!(bar(1.5, 6), "[||||]");
        assert_eq!(bar(f64::NAN, 4), "[  ]");
        assert_eq!(bar(0.5, 1), "[]");
    }

    #[test]
    fn sizes_and_lists() {
        assert_eq!(gib(24 * 1024), "24.0");
        assert_eq!(gib(512), "0.5");
        assert_eq!(indices([0, 2, 3].into_iter()), "0,2,3");
        assert_eq!(count(1, "node"), "1 node");
        assert_eq!(count(0, "GPU"), "0 GPUs");
        assert_eq!(celsius(Some(67)), "67°C");
        assert_eq!(celsius(None), "-");
        assert_eq!(watts(Some(250)), "250W");
        assert_eq!(watts(None), "-");
        let now = mgpu_protocol::now();
        assert_eq!(since(now - chrono::Duration::seconds(65), now), "1m05s");
        assert_eq!(since(now + chrono::Duration::seconds(5), now), "0s");
    }
}
