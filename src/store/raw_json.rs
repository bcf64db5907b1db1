//! Already-validated JSON bytes sent to Postgres as `jsonb` without re-encoding.

use bytes::BytesMut;
use postgres_types::{to_sql_checked, IsNull, ToSql, Type};

/// JSON text the server has validated, written in jsonb's binary wire format
/// (a version byte, then the text) so no serde round trip happens on the hot path.
#[derive(Debug, Clone, Copy)]
pub struct RawJson<'a>(pub &'a [u8]);

impl ToSql for RawJson<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.extend_from_slice(&[1]);
        }
        out.extend_from_slice(self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON || *ty == Type::TEXT
    }

    to_sql_checked!();
}
