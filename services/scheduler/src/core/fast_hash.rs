//! The hash of the per-pass shape maps (see `Shape` in the core): looked up twice per queued
//! job, where SipHash, the standard one made to resist hash flooding, was a sixth of a pass over
//! 100 000 jobs. Its keys are built by the scheduler from already validated requests.

/// The hasher the per-pass maps are built with.
pub(super) type FastHash = std::hash::BuildHasherDefault<FxHasher>;

/// The multiply-rotate hash of rustc's FxHash.
#[derive(Default)]
pub(super) struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}
