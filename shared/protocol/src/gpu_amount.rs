//! GPU amounts as fixed-point integers: [`GpuAmount::UNITS_PER_GPU`] units make one GPU.
//!
//! Fractions (`--gpus 0.5`) let several small jobs share one GPU. Sums of floats drift
//! (0.1 + 0.2 ≠ 0.3), so the scheduler only ever adds and compares integers; floats appear
//! only at the edges, when a person types a number or JSON carries one.
//!
//! Also here: the most memory one GPU can have ([`MAX_GPU_MEMORY_MIB`]), which a job's
//! request, a node's heartbeat and a job's usage are all checked against; it sits with the
//! other GPU bound ([`GpuAmount::MAX_GPUS`]) so that none of those three needs another's
//! module for it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::InvalidInput;

/// Largest GPU memory anyone could ask for or report, in MiB (16 TiB).
pub const MAX_GPU_MEMORY_MIB: u64 = 16 * 1024 * 1024;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuAmount(u32);

impl GpuAmount {
    pub const UNITS_PER_GPU: u32 = 10_000;
    pub const ZERO: GpuAmount = GpuAmount(0);
    pub const ONE: GpuAmount = GpuAmount(Self::UNITS_PER_GPU);
    /// Nobody has a node with more GPUs than this; anything larger is a typo.
    pub const MAX_GPUS: u32 = 1024;

    pub fn from_units(units: u32) -> Self {
        GpuAmount(units)
    }

    pub fn whole(gpus: u32) -> Self {
        GpuAmount(gpus.saturating_mul(Self::UNITS_PER_GPU))
    }

    pub fn units(self) -> u32 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// A whole number of GPUs (0, 1, 2, …) rather than a share of one.
    pub fn is_whole(self) -> bool {
        self.0.is_multiple_of(Self::UNITS_PER_GPU)
    }

    /// How many GPUs the job touches: a fraction occupies part of one GPU.
    pub fn gpu_count(self) -> u32 {
        self.0.div_ceil(Self::UNITS_PER_GPU)
    }

    fn from_decimal(value: f64) -> Result<Self, InvalidInput> {
        if !value.is_finite() || value < 0.0 {
            return Err(InvalidInput::new(format!(
                "GPU count must be 0 or more, not {value}"
            )));
        }
        if value > f64::from(Self::MAX_GPUS) {
            return Err(InvalidInput::new(format!(
                "GPU count {value} is more than any node has (at most {})",
                Self::MAX_GPUS
            )));
        }
        let scaled = value * f64::from(Self::UNITS_PER_GPU);
        let units = scaled.round();
        if (scaled - units).abs() > 1e-6 {
            return Err(InvalidInput::new(format!(
                "GPU count {value} is finer than 1/{} of a GPU",
                Self::UNITS_PER_GPU
            )));
        }
        let amount = GpuAmount(units as u32);
        if amount.units() > Self::UNITS_PER_GPU && !amount.is_whole() {
            return Err(InvalidInput::new(format!(
                "GPU count {value}: a share of a GPU must be below 1 (0.5, 0.25); above 1, ask for whole GPUs"
            )));
        }
        Ok(amount)
    }

    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / f64::from(Self::UNITS_PER_GPU)
    }
}

impl fmt::Display for GpuAmount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            write!(f, "{}", self.0 / Self::UNITS_PER_GPU)
        } else {
            let text = format!("{:.4}", self.as_f64());
            f.write_str(text.trim_end_matches('0'))
        }
    }
}

impl FromStr for GpuAmount {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value: f64 = s.trim().parse().map_err(|_| {
            InvalidInput::new(format!(
                "`{s}` is not a GPU count: use a whole number (2) or a share of one GPU (0.5)"
            ))
        })?;
        Self::from_decimal(value)
    }
}

impl Serialize for GpuAmount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_whole() {
            serializer.serialize_u32(self.0 / Self::UNITS_PER_GPU)
        } else {
            serializer.serialize_f64(self.as_f64())
        }
    }
}

impl<'de> Deserialize<'de> for GpuAmount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        GpuAmount::from_decimal(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn people_type_whole_numbers_and_shares() {
        assert_eq!("2".parse::<GpuAmount>().ok(), Some(GpuAmount::whole(2)));
        assert_eq!(
            "0.5".parse::<GpuAmount>().map(|a| a.units()).ok(),
            Some(5_000)
        );
        assert_eq!(
            "0.25".parse::<GpuAmount>().map(|a| a.to_string()).ok(),
            Some("0.25".into())
        );
        assert_eq!(GpuAmount::from_units(5_000).gpu_count(), 1);
        assert_eq!(GpuAmount::whole(3).gpu_count(), 3);
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        for bad in ["-1", "NaN", "inf", "1.5", "abc", "0.00001", "5000"] {
            assert!(bad.parse::<GpuAmount>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn json_round_trip_keeps_the_value() {
        for a in [
            GpuAmount::ZERO,
            GpuAmount::whole(4),
            GpuAmount::from_units(2_500),
        ] {
            let text = serde_json::to_string(&a).unwrap_or_default();
            let back: Result<GpuAmount, _> = serde_json::from_str(&text);
            assert_eq!(back.ok(), Some(a));
        }
        assert!(serde_json::from_str::<GpuAmount>("-3").is_err());
    }
}
