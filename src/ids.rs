//! Service-request ids: UUIDv7, made per thread without a shared lock.
//!
//! Time-ordered ids keep the primary-key index append-mostly. `Uuid::now_v7` goes
//! through a process-wide context; the hot path makes its own from the clock and a
//! thread-local generator instead (80 random bits make collisions within one millisecond
//! as unlikely as for v4).

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

/// A new UUIDv7.
#[inline]
pub fn new_v7() -> Uuid {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut rand = [0u8; 10];
    rand[..8].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    rand[8..].copy_from_slice(&fastrand::u16(..).to_le_bytes());
    uuid::Builder::from_unix_timestamp_millis(millis, &rand).into_uuid()
}

/// Slots in one intake batch: a request id is its batch's id with the slot in these bits.
pub const INTAKE_SLOTS: usize = 1 << INTAKE_SLOT_BITS;
const INTAKE_SLOT_BITS: u32 = 12;
const INTAKE_SLOT_MASK: u128 = (1 << INTAKE_SLOT_BITS) - 1;

/// A new intake batch id: a UUIDv7 whose low 12 bits are zero (68 random bits remain).
pub fn new_intake_batch() -> Uuid {
    Uuid::from_u128(new_v7().as_u128() & !INTAKE_SLOT_MASK)
}

/// The id of slot `slot` of intake batch `batch`.
#[inline]
pub fn intake_slot(batch: Uuid, slot: usize) -> Uuid {
    debug_assert!(slot < INTAKE_SLOTS);
    Uuid::from_u128(batch.as_u128() | slot as u128)
}

/// The intake batch an id would belong to (an id made otherwise maps to a batch that
/// does not exist).
#[inline]
pub fn intake_batch_of(id: Uuid) -> Uuid {
    Uuid::from_u128(id.as_u128() & !INTAKE_SLOT_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_v7_and_time_ordered() {
        let a = new_v7();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_v7();
        assert_eq!(a.get_version_num(), 7);
        assert!(a < b);
        assert_ne!(new_v7(), new_v7());
    }

    #[test]
    fn intake_ids_name_their_batch_and_stay_v7() {
        let batch = new_intake_batch();
        assert_eq!(batch.as_u128() & INTAKE_SLOT_MASK, 0);
        let last = intake_slot(batch, INTAKE_SLOTS - 1);
        assert_eq!(last.get_version_num(), 7);
        assert_eq!(intake_batch_of(last), batch);
        assert_eq!(intake_batch_of(intake_slot(batch, 0)), batch);
        assert_ne!(intake_slot(batch, 1), intake_slot(batch, 2));
    }
}
