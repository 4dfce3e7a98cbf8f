//! Who is looking at the screen: a leaf, so that the model and the rows worked out for it both
//! name the user without importing each other.

/// Who is looking: their jobs are highlighted, and only those they may cancel unless admin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Me {
    pub user: String,
    /// The public nkey their requests are signed with (a job's `user_key`).
    pub key: String,
}
