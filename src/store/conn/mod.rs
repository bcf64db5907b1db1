//! Reaching Postgres: connecting (one deadline per host, libpq's `sslmode`), the pool
//! (statements prepared per connection, aimed at a partition set when asked), the watchdog
//! under every pooled connection (a silent server is given up), and the migrations, run
//! under an advisory lock.

// The store's own items (its error, its result, `sql`), as the files here had them
// beside them before this room was made.
use super::*;

pub mod connect;
pub mod migrate;
pub(crate) mod pool;
mod watchdog;
