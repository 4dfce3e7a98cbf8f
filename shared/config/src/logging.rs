//! `--log-format text|json`: what the services write to standard error.
//!
//! `text` is tracing's usual line (coloured only at a terminal). `json` is one JSON object per
//! line for log collectors: `timestamp`, `level`, `target`, the service's own fields (the
//! agent's `node`), the fields of the spans the event is in, then the event's fields
//! (`message`, `job`, `node`, …), all at the top level so that a collector can index `job`
//! and `node` without knowing the nesting. tracing-subscriber's own JSON format nests span
//! fields under `span`, hence this small layer.

use std::io::Write as _;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global logger: `RUST_LOG` if set, else `default_filter`; `fields` go on every
/// JSON line (text lines leave them out: a person reading one host's log knows its node).
pub fn init(format: LogFormat, default_filter: &str, fields: &[(&str, &str)]) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // A second installation fails; the first logger stays, which is what a caller wants.
    let _ = match format {
        LogFormat::Text => {
            // Colours only for a person at a terminal; journald and log files get plain text.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .try_init()
                .map_err(|err| err.to_string())
        }
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(JsonLines::new(fields))
            .try_init()
            .map_err(|err| err.to_string()),
    };
}

/// Says why the service stops: `error: …` on standard error, or in JSON an `ERROR` line like
/// every other, so that a log collector parses the last words too. Call after [`init`].
pub fn fatal(format: LogFormat, why: &dyn std::fmt::Display) {
    match format {
        LogFormat::Text => eprintln!("error: {why}"),
        LogFormat::Json => tracing::error!("{why}"),
    }
}

/// The JSON-lines layer: writes each event as one object, by default on standard error.
pub struct JsonLines<W = fn() -> std::io::Stderr> {
    fields: Fields,
    make_writer: W,
}

impl JsonLines {
    /// A layer that writes to standard error and puts `fields` on every line.
    pub fn new(fields: &[(&str, &str)]) -> Self {
        JsonLines::with_writer(fields, std::io::stderr)
    }
}

impl<W> JsonLines<W>
where
    W: for<'w> MakeWriter<'w> + 'static,
{
    /// A layer that writes where `make_writer` says.
    pub fn with_writer(fields: &[(&str, &str)], make_writer: W) -> Self {
        let mut all = Fields::default();
        for (name, value) in fields {
            all.insert(name, Value::String((*value).to_owned()));
        }
        JsonLines {
            fields: all,
            make_writer,
        }
    }

    /// The line for one event, newline included.
    fn line<S>(&self, event: &Event<'_>, ctx: &Context<'_, S>) -> String
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let meta = event.metadata();
        let mut fields = Fields::default();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        fields.insert("timestamp", Value::String(now));
        fields.insert("level", Value::String(meta.level().as_str().to_owned()));
        fields.insert("target", Value::String(meta.target().to_owned()));
        fields.extend(&self.fields);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    fields.extend(span_fields);
                }
            }
        }
        event.record(&mut fields);
        fields.to_line()
    }
}

impl<S, W> Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let line = self.line(event, &ctx);
        // One write of the whole line (standard error's takes its lock for it), so that
        // lines from several threads never mix.
        let _ = self.make_writer.make_writer().write_all(line.as_bytes());
    }
}

/// Fields in the order first seen; a later value of a name replaces the earlier one (an
/// event's `node` over the service's).
#[derive(Clone, Debug, Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn insert(&mut self, name: &str, value: Value) {
        match self.0.iter_mut().find(|(known, _)| known == name) {
            Some((_, old)) => *old = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    fn extend(&mut self, other: &Fields) {
        for (name, value) in &other.0 {
            self.insert(name, value.clone());
        }
    }

    fn to_line(&self) -> String {
        let mut line = String::from("{");
        // serde_json's map sorts its keys; written by hand, the timestamp and level come first.
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push_str(&Value::String(name.clone()).to_string());
            line.push(':');
            line.push_str(&value.to_string());
        }
        line.push_str("}\n");
        line
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, Value::String(value.to_owned()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.record(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // Not a number and infinities have no JSON form: `null`.
        self.record(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record(field, Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record(field, Value::String(format!("{value:?}")));
    }
}

impl Fields {
    fn record(&mut self, field: &Field, value: Value) {
        // Records that came through the `log` crate carry their origin as `log.*` fields;
        // the target already says it.
        if !field.name().starts_with("log.") {
            self.insert(field.name(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What the layer wrote, kept instead of written to standard error.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut kept) = self.0.lock() {
                kept.extend_from_slice(bytes);
            }
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_event_is_one_json_object_with_its_fields_at_the_top() {
        let captured = Captured::default();
        let writer = captured.clone();
        let layer = JsonLines::with_writer(&[("node", "node001")], move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("supervise", attempt = 2u32);
            let _entered = span.enter();
            tracing::info!(job = "j1", exit_code = 0, "job \"exited\"\nnext");
            tracing::warn!(node = "other", ratio = 0.5, "second");
        });
        let text = captured
            .0
            .lock()
            .map(|kept| String::from_utf8_lossy(&kept).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("{\"timestamp\":"), "{text}");
        let object = |line: &str| -> serde_json::Map<String, Value> {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
        };
        let first = object(lines[0]);
        assert_eq!(first["job"], "j1");
        assert_eq!(first["node"], "node001");
        assert_eq!(first["attempt"], 2);
        assert_eq!(first["exit_code"], 0);
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["message"], "job \"exited\"\nnext");
        let second = object(lines[1]);
        assert_eq!(second["node"], "other", "the event's own field wins");
        assert_eq!(second["ratio"], 0.5);
        assert_eq!(second["level"], "WARN");
    }

    #[test]
    fn the_format_is_chosen_by_name() {
        use clap::ValueEnum as _;
        assert_eq!(LogFormat::from_str("json", false), Ok(LogFormat::Json));
        assert_eq!(LogFormat::from_str("text", false), Ok(LogFormat::Text));
        assert!(LogFormat::from_str("xml", false).is_err());
    }
}
