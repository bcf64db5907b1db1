//! What status reads are answered from besides Postgres, kept by this process: final
//! answers of requests that finished here (`finals`), the long polls waiting for a
//! request's next change (`watch`), and the requests paused here with their workflow
//! (`paused`). The engine fills them as its writes commit; `ops::read` answers from them.
//! Each holds only what a database read would answer.

pub(crate) mod finals;
pub(crate) mod paused;
pub(crate) mod watch;
