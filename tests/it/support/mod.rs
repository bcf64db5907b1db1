//! Test support, one file per thing supported, all re-exported here so a test file needs
//! only `use crate::support::*;`:
//! - `database`: fresh databases per test, and throwaway clusters from `dev-postgres.sh`;
//! - `server`: servers started in-process, their configuration, and the requests tests
//!   create and wait on through them;
//! - `binary`: the real binary as a child process, and waiting for it to be healthy;
//! - `http`: a small HTTP client (one request per connection, or a keep-alive one);
//! - `proxy`: a TCP proxy that can cut or stall the server's Postgres connections;
//! - `recorder`: a listener that records whether it was dialled, and what it heard;
//! - `waiting`: `wait_for` and its kin, the one way tests wait for a condition;
//! - `metrics`: reading a value out of a metrics exposition;
//! - `alone`: the machine to one test that bounds how long the server takes.

#![allow(dead_code)]

mod alone;
mod binary;
mod database;
mod http;
mod metrics;
mod proxy;
mod recorder;
mod server;
mod waiting;

pub use binary::*;
pub use database::*;
pub use http::*;
pub use metrics::*;
pub use proxy::*;
pub use recorder::*;
pub use server::*;
pub use waiting::*;
