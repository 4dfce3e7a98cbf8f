//! Setting up a cluster's files: [`auth`] (principals' nkeys, the server's authorization and
//! configuration, for one server or a cluster) and [`tls`] (the private certificate authority
//! and the server's certificate).

pub mod auth;
pub mod tls;
