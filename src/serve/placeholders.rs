//! `?` placeholders, as JDBC and ODBC clients write a statement's parameters, turned into the
//! `$1`, `$2`, ... that DataFusion binds (its parser reads every `?` as one parameter named `?`).
//! A `?` inside a string, a quoted name or a comment is text, and stays.

use tonic::Status;

/// `sql` with its `?` placeholders numbered in order (`$1`, `$2`, ...); `sql` as it is where it
/// has none. A statement with both kinds is refused: which `?` is `$2` would be a guess.
pub(crate) fn numbered(sql: &str) -> Result<std::borrow::Cow<'_, str>, Status> {
    if !sql.contains('?') {
        return Ok(sql.into());
    }
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let (mut at, mut copied, mut count) = (0, 0, 0);
    let mut dollar = false;
    while at < bytes.len() {
        match bytes[at] {
            quote @ (b'\'' | b'"') => at = quoted_end(bytes, at, quote),
            b'-' if bytes.get(at + 1) == Some(&b'-') => {
                at = bytes[at..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |n| at + n + 1);
            }
            b'/' if bytes.get(at + 1) == Some(&b'*') => {
                at = sql[at + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| at + 2 + n + 2);
            }
            b'$' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                dollar = true;
                at += 1;
            }
            b'?' => {
                count += 1;
                out.push_str(&sql[copied..at]);
                out.push_str(&format!("${count}"));
                at += 1;
                copied = at;
            }
            _ => at += 1,
        }
    }
    if count == 0 {
        return Ok(sql.into());
    }
    if dollar {
        return Err(Status::invalid_argument(
            "the statement mixes `?` and `$1`-style parameters: write them one way",
        ));
    }
    out.push_str(&sql[copied..]);
    Ok(out.into())
}

/// Where the string or quoted name starting at `start` ends (past its closing quote; a doubled
/// quote inside is one quote character), or the end of the text.
fn quoted_end(bytes: &[u8], start: usize, quote: u8) -> usize {
    let mut at = start + 1;
    while at < bytes.len() {
        if bytes[at] == quote {
            if bytes.get(at + 1) == Some(&quote) {
                at += 2;
                continue;
            }
            return at + 1;
        }
        at += 1;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn question_marks_are_numbered_in_order_outside_strings_names_and_comments() {
        let sql =
            "SELECT '?', \"a?\" FROM t -- why?\n WHERE a = ? /* or? */ AND b = ? AND c = 'it''s?'";
        assert_eq!(
            numbered(sql).unwrap(),
            "SELECT '?', \"a?\" FROM t -- why?\n WHERE a = $1 /* or? */ AND b = $2 AND c = 'it''s?'"
        );
        assert_eq!(numbered("SELECT ?").unwrap(), "SELECT $1");
        // Nothing to number: the text itself.
        for sql in [
            "SELECT $1, $2",
            "SELECT 'why?'",
            "SELECT 1 -- ?",
            "SELECT 1",
        ] {
            assert_eq!(numbered(sql).unwrap(), sql);
        }
        let err = numbered("SELECT ? + $1").unwrap_err();
        assert!(err.message().contains("mixes"), "{err:?}");
        // A string left open: what follows is in it.
        assert_eq!(numbered("SELECT 'a ? b").unwrap(), "SELECT 'a ? b");
    }
}
