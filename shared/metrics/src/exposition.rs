//! The Prometheus text exposition format, version 0.0.4: one `# HELP` and `# TYPE` line per
//! metric family, then its samples, `name{label="value",…} number`.
//!
//! A family's header is held back until its first sample, so a family with no sample (no
//! refusal yet, no temperature sensor) is left out rather than announced empty. Histograms
//! are written the standard way: cumulative `_bucket{le="…"}` samples ending with `+Inf`,
//! then `_sum` and `_count`.

use std::fmt::Write;

/// What a metric family is, as its `# TYPE` line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the process restarts); its name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations counted into buckets.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// An exposition being written, family after family.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// The family samples are written for.
    family: String,
    /// Its HELP and TYPE lines, until its first sample is written.
    pending: Option<String>,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition::default()
    }

    /// Starts a family: the samples written next belong to it.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        debug_assert!(valid_metric_name(name), "bad metric name {name}");
        let mut header = String::with_capacity(name.len() * 2 + help.len() + 32);
        let _ = writeln!(header, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(header, "# TYPE {name} {}", kind.as_str());
        self.pending = Some(header);
        self.family.clear();
        self.family.push_str(name);
        self
    }

    /// A sample of the current family (a counter or a gauge).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.flush_header();
        let name = std::mem::take(&mut self.family);
        self.line(&name, labels, None, value);
        self.family = name;
        self
    }

    /// The samples of one histogram of the current family: its buckets, sum and count.
    pub fn histogram(&mut self, labels: &[(&str, &str)], histogram: &Histogram) -> &mut Self {
        self.flush_header();
        let name = std::mem::take(&mut self.family);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            self.line(&bucket, labels, Some(*bound), cumulative as f64);
        }
        self.line(&bucket, labels, Some(f64::INFINITY), histogram.count as f64);
        self.line(&format!("{name}_sum"), labels, None, histogram.sum);
        self.line(
            &format!("{name}_count"),
            labels,
            None,
            histogram.count as f64,
        );
        self.family = name;
        self
    }

    /// The text to serve.
    pub fn finish(self) -> String {
        self.text
    }

    fn flush_header(&mut self) {
        if let Some(header) = self.pending.take() {
            self.text.push_str(&header);
        }
    }

    fn line(&mut self, name: &str, labels: &[(&str, &str)], le: Option<f64>, value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() || le.is_some() {
            self.text.push('{');
            let mut first = true;
            for (label, label_value) in labels {
                debug_assert!(valid_label_name(label), "bad label name {label}");
                if !first {
                    self.text.push(',');
                }
                first = false;
                self.text.push_str(label);
                self.text.push_str("=\"");
                escape_label_value(&mut self.text, label_value);
                self.text.push('"');
            }
            if let Some(bound) = le {
                if !first {
                    self.text.push(',');
                }
                self.text.push_str("le=\"");
                write_number(&mut self.text, bound);
                self.text.push('"');
            }
            self.text.push('}');
        }
        self.text.push(' ');
        write_number(&mut self.text, value);
        self.text.push('\n');
    }
}

/// Observations counted into fixed buckets (each counts those at or below its bound), with
/// their sum: what `histogram_quantile` and averages over time are computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implied.
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative), one per bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending, finite).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts one observation; a NaN is ignored (it would poison the sum).
    pub fn observe(&mut self, value: f64) {
        if value.is_nan() {
            return;
        }
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        if let Some(count) = self.counts.get_mut(bucket) {
            *count += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// Whether `name` is a valid metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name: `[a-zA-Z_][a-zA-Z0-9_]*`, not reserved (`__…`).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Numbers as the format spells them: `+Inf`, `-Inf`, `NaN`, else Rust's shortest decimal
/// (which never uses an exponent, and writes whole numbers without a fraction).
fn write_number(text: &mut String, value: f64) {
    if value.is_nan() {
        text.push_str("NaN");
    } else if value == f64::INFINITY {
        text.push_str("+Inf");
    } else if value == f64::NEG_INFINITY {
        text.push_str("-Inf");
    } else if value == 0.0 {
        // Also -0.0 (an empty float sum), which would read `-0`.
        text.push('0');
    } else {
        let _ = write!(text, "{value}");
    }
}

/// A label value with `\`, `"` and line feeds escaped.
fn escape_label_value(text: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => text.push_str("\\\\"),
            '"' => text.push_str("\\\""),
            '\n' => text.push_str("\\n"),
            c => text.push(c),
        }
    }
}

/// HELP text with `\` and line feeds escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_written_with_its_header_before_its_samples() {
        let mut out = Exposition::new();
        out.family("mgpu_nodes", Kind::Gauge, "Nodes by state.")
            .sample(&[("state", "online")], 2.0)
            .sample(&[("state", "offline")], 0.0);
        assert_eq!(
            out.finish(),
            "# HELP mgpu_nodes Nodes by state.\n# TYPE mgpu_nodes gauge\n\
             mgpu_nodes{state=\"online\"} 2\nmgpu_nodes{state=\"offline\"} 0\n"
        );
    }

    #[test]
    fn a_family_without_samples_is_left_out() {
        let mut out = Exposition::new();
        out.family("mgpu_gpu_temperature_celsius", Kind::Gauge, "Unknown here.");
        out.family("mgpu_scheduler_leader", Kind::Gauge, "Leader.")
            .sample(&[], 1.0);
        assert_eq!(
            out.finish(),
            "# HELP mgpu_scheduler_leader Leader.\n# TYPE mgpu_scheduler_leader gauge\n\
             mgpu_scheduler_leader 1\n"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut out = Exposition::new();
        out.family("x", Kind::Gauge, "a \\ b\nc")
            .sample(&[("user", "a\"b\\c\nd")], 0.5);
        assert_eq!(
            out.finish(),
            "# HELP x a \\\\ b\\nc\n# TYPE x gauge\nx{user=\"a\\\"b\\\\c\\nd\"} 0.5\n"
        );
    }

    #[test]
    fn numbers_are_spelled_as_the_format_wants() {
        let mut text = String::new();
        for value in [
            1.0,
            0.25,
            25_769_803_776.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.0,
        ] {
            write_number(&mut text, value);
            text.push(' ');
        }
        assert_eq!(text, "1 0.25 25769803776 +Inf -Inf NaN 0 ");
    }

    #[test]
    fn histograms_are_cumulative_and_end_with_inf_sum_and_count() {
        static BOUNDS: [f64; 3] = [0.1, 1.0, 10.0];
        let mut histogram = Histogram::new(&BOUNDS);
        // Binary fractions, so the sum is exact; 1.0 sits on a bound and counts in its bucket.
        for value in [0.0625, 0.09375, 1.0, 20.0, f64::NAN] {
            histogram.observe(value);
        }
        assert_eq!(histogram.count(), 4);
        let mut out = Exposition::new();
        out.family("wait_seconds", Kind::Histogram, "Waits.")
            .histogram(&[("user", "alice")], &histogram);
        let text = out.finish();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            vec![
                "wait_seconds_bucket{user=\"alice\",le=\"0.1\"} 2",
                "wait_seconds_bucket{user=\"alice\",le=\"1\"} 3",
                "wait_seconds_bucket{user=\"alice\",le=\"10\"} 3",
                "wait_seconds_bucket{user=\"alice\",le=\"+Inf\"} 4",
                "wait_seconds_sum{user=\"alice\"} 21.15625",
                "wait_seconds_count{user=\"alice\"} 4",
            ]
        );
        assert!(text.contains("# TYPE wait_seconds histogram\n"));
    }

    #[test]
    fn names_are_checked_against_the_format_s_grammar() {
        assert!(valid_metric_name("mgpu_gpu_power_watts"));
        assert!(valid_metric_name("ns:metric"));
        assert!(!valid_metric_name("1abc"));
        assert!(!valid_metric_name("mgpu-gpu"));
        assert!(!valid_metric_name(""));
        assert!(valid_label_name("job_id"));
        assert!(!valid_label_name("__name__"));
        assert!(!valid_label_name("a:b"));
    }
}
