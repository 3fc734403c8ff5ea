//! One JSON record into the user's serde type, for every library source (JSON lines,
//! a Kafka partition, a task of a consumer group). A record that does not decode is a
//! dead letter whose reason uses the command line's words: `not valid JSON at byte 17:
//! ...`, `not a JSON object (found an array)`, `missing field visit_id`, `field page is
//! not a string (found an integer)` — never serde's own positions and type names.

use crate::error::RecordError;
use serde::de::DeserializeOwned;
use sessionizer_core::decode::Invalid;
use sessionizer_core::json::Extractor;

/// Decodes `raw` as an `E`; `oversized` is its whole length when it is longer than the
/// record size limit `max_record` (then `raw` holds only its first bytes and it is
/// refused without being read).
pub(crate) fn decode<E: DeserializeOwned>(
    raw: &[u8],
    oversized: Option<u64>,
    max_record: usize,
) -> Result<E, RecordError> {
    if let Some(len) = oversized {
        return Err(RecordError::TooLarge {
            len,
            limit: max_record,
        });
    }
    serde_json::from_slice(raw).map_err(|_| RecordError::Undecodable(refusal::<E>(raw)))
}

/// Why `raw` is not an `E` (it failed to decode), in the command line's words.
fn refusal<E: DeserializeOwned>(raw: &[u8]) -> String {
    // Syntax, UTF-8, nesting and "not an object" are judged by the command line's own
    // scanner, so that both say the same of the same bytes.
    if let Err(e) = Extractor::new(&[]).scan(raw, &mut []) {
        return Invalid::from(e).to_string();
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    match serde_path_to_error::deserialize::<_, E>(&mut de) {
        Ok(_) => "not a record of the job's event type".to_string(),
        Err(e) => {
            let path = e.path().to_string();
            describe(&path, &without_position(&e.into_inner().to_string()))
        }
    }
}

/// serde_json's message without its ` at line 1 column 17`.
fn without_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// A serde data error at `path` (`.` for the record itself) in the command line's words.
fn describe(path: &str, message: &str) -> String {
    let field = |name: &str| match path {
        "." | "" => name.to_string(),
        p => format!("{p}.{name}"),
    };
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some(name) = rest.strip_suffix('`')
    {
        return format!("missing field {}", field(name));
    }
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((name, _)) = rest.split_once('`')
    {
        return format!("unknown field {}", field(name));
    }
    let subject = match path {
        "." | "" => "the record".to_string(),
        p => format!("field {p}"),
    };
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        if found == "null" || found == "unit value" {
            return format!("{subject} is null");
        }
        return format!(
            "{subject} is not {} (found {})",
            kind_of_expected(expected),
            kind_of_found(found)
        );
    }
    // A type's own refusal worded as "not ..." (the time format's "not a valid
    // timestamp: ...") reads on from the field's name.
    if message.starts_with("not ") {
        return format!("{subject} is {message}");
    }
    format!("{subject} is not valid: {message}")
}

/// serde's "unexpected" value as the command line names a JSON kind.
fn kind_of_found(found: &str) -> &str {
    for (prefix, kind) in [
        ("integer", "an integer"),
        ("floating point", "a float"),
        ("string", "a string"),
        ("map", "an object"),
        ("sequence", "an array"),
        ("boolean", "a boolean"),
        ("char", "a string"),
    ] {
        if found.starts_with(prefix) {
            return kind;
        }
    }
    found
}

/// serde's "expected" text as a JSON kind where it names one.
fn kind_of_expected(expected: &str) -> &str {
    match expected {
        "i8" | "i16" | "i32" | "i64" | "i128" | "u8" | "u16" | "u32" | "u64" | "u128" | "isize"
        | "usize" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" | "tuple" => "an array",
        "a map" => "an object",
        "a boolean" => "a boolean",
        e if e.starts_with("struct ") || e.starts_with("a map") => "an object",
        e if e.starts_with("a string") || e == "a borrowed string" || e == "a char" => "a string",
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Visit {
        visit_id: String,
        count: u32,
        context: Context,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Timed {
        #[serde(with = "crate::api::time::rfc3339")]
        at: sessionizer_core::EventTime,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Context {
        user: String,
    }

    fn reason(raw: &str) -> String {
        decode::<Visit>(raw.as_bytes(), None, 1 << 20)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn reasons_are_the_command_lines() {
        assert_eq!(
            reason("[1,2]"),
            "not a JSON object (found an array)",
            "serde would say: invalid type: sequence"
        );
        assert!(reason("{\"visit_id\":").starts_with("not valid JSON at byte 12:"));
        assert_eq!(
            reason(r#"{"count":1,"context":{"user":"u"}}"#),
            "missing field visit_id"
        );
        assert_eq!(
            reason(r#"{"visit_id":"v","count":1,"context":{}}"#),
            "missing field context.user"
        );
        assert_eq!(
            reason(r#"{"visit_id":5,"count":1,"context":{"user":"u"}}"#),
            "field visit_id is not a string (found an integer)"
        );
        assert_eq!(
            reason(r#"{"visit_id":"v","count":"x","context":{"user":"u"}}"#),
            "field count is not an integer (found a string)"
        );
        assert_eq!(
            reason(r#"{"visit_id":null,"count":1,"context":{"user":"u"}}"#),
            "field visit_id is null"
        );
        assert_eq!(
            reason(r#"{"visit_id":"v","count":1,"context":"x"}"#),
            "field context is not an object (found a string)"
        );
        assert_eq!(
            decode::<Timed>(br#"{"at":"24-01-01"}"#, None, 1 << 20)
                .expect_err("refused")
                .to_string(),
            "field at is not a valid timestamp: expected a 4-digit year"
        );
        assert_eq!(
            decode::<Visit>(b"{\"visit_id\":", Some(20_000_000), 16 << 20)
                .expect_err("big")
                .to_string(),
            sessionizer_connectors::input::too_large_reason(20_000_000, 16 << 20)
        );
    }
}
