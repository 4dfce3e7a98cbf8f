//! Setting up a cluster's files: [`auth`] (principals' nkeys, the server's authorization and
//! configuration, for one server or a cluster), [`tls`] (the private certificate authority
//! and the server's certificate), [`notify_access`] (what notifications add to the roles'
//! permissions), and [`files`] (how both write without exposing a secret or
//! half a file).

pub mod auth;
pub mod files;
pub mod notify_access;
pub mod tls;
