//! Durations as people type them, and as listings show them.
//!
//! Accepted: plain seconds (`90`), unit suffixes that may be combined (`10m`, `2h`, `1h30m`,
//! `45s`, `2d`), and Slurm's `[D-]HH:MM:SS` / `MM:SS` forms (`1-00:00:00`).

use std::time::Duration;

use crate::error::InvalidInput;

/// A time limit longer than this is a typo, not a plan.
pub const MAX_TIME_LIMIT: Duration = Duration::from_secs(366 * 24 * 3600);

pub fn parse_duration(text: &str) -> Result<Duration, InvalidInput> {
    let s = text.trim();
    let bad = || {
        InvalidInput::new(format!(
            "`{text}` is not a duration: use seconds (90), units (10m, 2h, 1h30m, 2d) or [D-]HH:MM:SS"
        ))
    };
    if s.is_empty() {
        return Err(bad());
    }
    let seconds: u64 = if s.contains(':') {
        let (days, clock) = match s.split_once('-') {
            Some((d, rest)) => (d.parse::<u64>().map_err(|_| bad())?, rest),
            None => (0, s),
        };
        let parts: Vec<u64> = clock
            .split(':')
            .map(|p| p.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let (h, m, sec) = match parts.as_slice() {
            [m, sec] => (0, *m, *sec),
            [h, m, sec] => (*h, *m, *sec),
            _ => return Err(bad()),
        };
        if m >= 60 || sec >= 60 {
            return Err(bad());
        }
        days.checked_mul(86_400)
            .and_then(|d| d.checked_add(h.checked_mul(3600)?))
            .and_then(|t| t.checked_add(m * 60 + sec))
            .ok_or_else(bad)?
    } else if s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().map_err(|_| bad())?
    } else {
        let mut total: u64 = 0;
        let mut number = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            let n: u64 = number.parse().map_err(|_| bad())?;
            number.clear();
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
        }
        if !number.is_empty() {
            return Err(bad());
        }
        total
    };
    let duration = Duration::from_secs(seconds);
    if duration.is_zero() {
        return Err(InvalidInput::new(format!(
            "`{text}`: a duration must be longer than 0"
        )));
    }
    if duration > MAX_TIME_LIMIT {
        return Err(InvalidInput::new(format!(
            "`{text}` is longer than the longest allowed time limit (366 days)"
        )));
    }
    Ok(duration)
}

/// Short form for listings: `42s`, `5m03s`, `2h05m`, `3d04h`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(text: &str) -> Option<u64> {
        parse_duration(text).ok().map(|d| d.as_secs())
    }

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(secs("90"), Some(90));
        assert_eq!(secs("10m"), Some(600));
        assert_eq!(secs("2h"), Some(7200));
        assert_eq!(secs("1h30m"), Some(5400));
        assert_eq!(secs("1-00:00:00"), Some(86_400));
        assert_eq!(secs("01:30"), Some(90));
        assert_eq!(secs("2:00:00"), Some(7200));
    }

    #[test]
    fn nonsense_and_absurd_values_are_refused() {
        for bad in [
            "",
            "0",
            "-5",
            "10x",
            "m",
            "1:99",
            "100y",
            "36600d",
            "1-2-3:00:00",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn listings_are_short() {
        assert_eq!(format_duration(Duration::from_secs(42)), "42s");
        assert_eq!(format_duration(Duration::from_secs(303)), "5m03s");
        assert_eq!(format_duration(Duration::from_secs(7500)), "2h05m");
    }
}
