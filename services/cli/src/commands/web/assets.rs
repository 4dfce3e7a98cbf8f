//! The web dashboard's files, embedded at build time: `build.rs` writes the table from
//! `services/web/dist/` (empty when the page was not built).

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
