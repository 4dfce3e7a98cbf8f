//! The campaign's random draws: one stream per seed (splitmix64), so a seed replays the same
//! workload and the same faults at the same moments of the campaign.

/// A seeded stream of draws.
pub struct Draw(u64);

impl Draw {
    pub fn new(seed: u64, stream: u64) -> Draw {
        Draw(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// One of `choices`.
    pub fn pick<'a, T>(&mut self, choices: &'a [T]) -> &'a T {
        let index = self.between(0, choices.len() as u64 - 1) as usize;
        &choices[index]
    }

    /// True with probability `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.between(1, 100) <= percent
    }
}

/// A seed from the clock, for a campaign nobody ran before.
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |since| since.as_nanos() as u64 % 1_000_000_000)
}
