//! Errors with their causes, the one way they are walked and printed.

use std::error::Error;

/// `e`, then its source, then that one's source, and so on.
pub fn sources<'a>(
    e: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |e: &&'a (dyn Error + 'static)| (*e).source())
}

/// `e` and its causes on one line, `": "` between them; a cause whose text the line
/// already holds (many errors repeat their source's message) is left out.
pub fn one_line(e: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    for c in sources(e) {
        let msg = c.to_string();
        if line.is_empty() {
            line = msg;
        } else if !line.contains(&msg) {
            line.push_str(": ");
            line.push_str(&msg);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{msg}")]
    struct E {
        msg: &'static str,
        #[source]
        source: Option<Box<E>>,
    }

    #[test]
    fn prints_each_new_cause_once() {
        let inner = E {
            msg: "connection refused",
            source: None,
        };
        let mid = E {
            msg: "connect failed: connection refused",
            source: Some(Box::new(inner)),
        };
        let outer = E {
            msg: "cannot start",
            source: Some(Box::new(mid)),
        };
        assert_eq!(sources(&outer).count(), 3);
        assert_eq!(
            one_line(&outer),
            "cannot start: connect failed: connection refused"
        );
    }
}
