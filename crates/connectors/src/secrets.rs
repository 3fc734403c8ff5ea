//! Client properties that hold secrets (passwords, keys): their values are never
//! printed — not in logs, errors, stats or a `Debug` — and they can come from the
//! environment instead of the command line, where `ps` would show them.

use std::borrow::Cow;
use std::sync::{Mutex, OnceLock};

/// Whether the librdkafka property `key` holds a secret: its value is never printed.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key == "ssl.key.pem"
        || key == "sasl.oauthbearer.config"
        || key == "sasl.jaas.config"
}

/// The values of every secret property a client of this process was given.
fn registry() -> &'static Mutex<Vec<String>> {
    static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Remembers the values of the secret properties among `properties`, so that
/// [`redact`] hides them wherever they would be printed.
pub fn register(properties: &[(String, String)]) {
    let mut secrets = registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (k, v) in properties {
        if is_secret(k) && !v.is_empty() && !secrets.contains(v) {
            secrets.push(v.clone());
        }
    }
    // Longer first, so that a secret containing another is hidden whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// What is printed in place of a secret.
pub const REDACTED: &str = "[redacted]";

/// `text` with every registered secret value replaced by [`REDACTED`]: for messages
/// that quote what a client or a broker said.
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_string();
    for s in secrets.iter() {
        out = out.replace(s.as_str(), REDACTED);
    }
    Cow::Owned(out)
}

/// `properties` as `key=value` pairs with the secrets' values hidden: for `Debug`.
pub fn shown(properties: &[(String, String)]) -> Vec<(String, String)> {
    properties
        .iter()
        .map(|(k, v)| {
            let v = if is_secret(k) {
                REDACTED.to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// The prefix of environment variables that set client properties: `SESSIONIZER_KAFKA_`
/// followed by the property's name in capitals with `_` for `.`
/// (`SESSIONIZER_KAFKA_SASL_PASSWORD` is `sasl.password`). librdkafka's property
/// names have no `_`, so the mapping is one to one.
pub const ENV_PREFIX: &str = "SESSIONIZER_KAFKA_";

/// The client properties set in the environment ([`ENV_PREFIX`]), in name order.
pub fn env_properties() -> Vec<(String, String)> {
    properties_of(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    )
}

fn properties_of(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vars
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(ENV_PREFIX)?;
            (!name.is_empty()).then(|| (name.to_ascii_lowercase().replace('_', "."), v))
        })
        .collect();
    out.sort();
    out
}

/// Merges property lists, later lists winning per key (a flag over the environment
/// over the config file); the first list's order comes first.
pub fn merge(lists: &[&[(String, String)]]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for list in lists {
        for (k, v) in *list {
            match out.iter_mut().find(|(key, _)| key == k) {
                Some(slot) => slot.1 = v.clone(),
                None => out.push((k.clone(), v.clone())),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_hidden_in_messages_and_debug_listings() {
        let props = vec![
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.password".to_string(), "s3cr3t-pw".to_string()),
            ("ssl.key.password".to_string(), "k3y-pw".to_string()),
        ];
        register(&props);
        assert_eq!(
            redact("auth with s3cr3t-pw and k3y-pw failed"),
            "auth with [redacted] and [redacted] failed"
        );
        assert_eq!(redact("nothing to hide"), "nothing to hide");
        let shown = shown(&props);
        assert_eq!(shown[0].1, "SASL_SSL");
        assert_eq!(shown[1].1, REDACTED);
        assert_eq!(shown[2].1, REDACTED);
    }

    #[test]
    fn environment_variables_name_properties() {
        let vars = [
            ("SESSIONIZER_KAFKA_SASL_PASSWORD", "pw"),
            ("SESSIONIZER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("SESSIONIZER_KAFKA_", "ignored"),
            ("OTHER", "x"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            properties_of(vars.into_iter()),
            vec![
                ("sasl.password".to_string(), "pw".to_string()),
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ]
        );
    }

    #[test]
    fn later_lists_win_per_key() {
        let file = [("a", "1"), ("sasl.password", "from-file")].map(|(k, v)| (k.into(), v.into()));
        let flags = [("a", "2"), ("b", "3")].map(|(k, v)| (k.into(), v.into()));
        assert_eq!(
            merge(&[&file, &flags]),
            [("a", "2"), ("sasl.password", "from-file"), ("b", "3")]
                .map(|(k, v): (&str, &str)| (k.to_string(), v.to_string()))
        );
    }
}
