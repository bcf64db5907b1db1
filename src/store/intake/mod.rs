//! What comes in: the write buffer of creates and its flusher (one INSERT a batch,
//! answered after its commit; when its next batch may leave is `batches::flights`), a
//! create's time budget from entering the buffer (`budget`), idempotency keys, and
//! delayed creates.

// The store's own items (its error, its result, `sql`, the partitions), as the files here
// had them beside them before this room was made.
use super::*;

pub(crate) mod budget;
pub(crate) mod buffer;
pub(crate) mod delayed;
pub(crate) mod idempotency;
