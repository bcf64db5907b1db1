//! `GET /serviceRequests?status=&workflow=&createdAfter=&createdBefore=&rerunOf=&limit=&cursor=`
//! (beyond Clamp): search, newest first, in keyset pages (`ops::lists`). Every filter is
//! optional; a bad one is a 400 that names it.

use hyper::StatusCode;

use super::answers::request_item;
use super::response::{json, op_error, Resp};
use crate::ops::lists;
use crate::state::Core;

pub async fn search(core: &Core, query: Option<&str>) -> Resp {
    let filter = match lists::search_filter(&lists::pairs(query)) {
        Ok(f) => f,
        Err(e) => return op_error(e),
    };
    match lists::search(&core.pool, &filter).await {
        Ok((items, next)) => json(
            StatusCode::OK,
            &serde_json::json!({
                "serviceRequests": items.iter().map(request_item).collect::<Vec<_>>(),
                "nextCursor": next.map(|id| id.simple().to_string()),
            }),
        ),
        Err(e) => op_error(e),
    }
}
