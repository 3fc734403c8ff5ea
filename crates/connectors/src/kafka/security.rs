//! Telling a configuration error of a secured cluster (a wrong password, an unknown
//! CA, a client speaking plaintext to a TLS listener, a missing ACL) from a broker that
//! is only away. (Secrets in client properties: [`crate::secrets`].)
//!
//! librdkafka retries a connection whose authentication failed as if the broker were
//! down, so a wrong password would otherwise show as "cannot reach the brokers" after
//! the whole `--kafka-timeout`. Every client of a job shares one [`ClientWatch`]: its
//! error callback notes such an error, and the calls that wait on the cluster stop as
//! soon as one is noted, with the error's own words.

use crate::secrets::redact;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A client context that reports its errors to a [`ClientWatch`] and the logs: for the
/// clients that need nothing else of a context (metadata, admin). Its second field is
/// the most verbose librdkafka log level passed on to the logs (the user's
/// `log_level`, 3 by default): these clients are told to log their failed connections
/// (level 6) so that a listener speaking another protocol shows.
#[derive(Debug, Clone)]
pub struct Watched(pub ClientWatch, pub i32);

impl rdkafka::ClientContext for Watched {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        if fac == "FAIL" {
            self.0.failed_connection(message);
        }
        if level as i32 > self.1 {
            return;
        }
        forward_log(&self.0, level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        log_error(&self.0, &error, reason, "Kafka client");
    }
}

impl rdkafka::consumer::ConsumerContext for Watched {}

/// Passes a librdkafka log line on to the logs, its secrets hidden. Once the cluster
/// answered, a failed connection (`FAIL`) is a broker going away — restarting,
/// replaced — which librdkafka retries and a job that has to wait says once (see
/// [`crate::kafka::is_transient`]): a detail, logged at debug level.
pub fn forward_log(
    watch: &ClientWatch,
    level: rdkafka::config::RDKafkaLogLevel,
    fac: &str,
    message: &str,
) {
    use rdkafka::config::RDKafkaLogLevel as L;
    // Also the failures that follow from a broker going away (a request or a
    // transaction's records timed out, a transport failure).
    let away = fac == "FAIL"
        || [
            "transport failure",
            "timed out",
            "Connection refused",
            "Disconnected",
        ]
        .iter()
        .any(|m| message.contains(m));
    let level = if away && watch.is_connected() {
        L::Debug
    } else {
        level
    };
    let message = redact(message);
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "{fac} {message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "{fac} {message}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "{fac} {message}"),
    }
}

/// Notes `error` in `watch` and logs it, secrets hidden (an error that usually passes
/// as a detail: see [`crate::kafka::is_transient`]).
pub fn log_error(watch: &ClientWatch, error: &rdkafka::error::KafkaError, reason: &str, who: &str) {
    watch.note(error, reason);
    if crate::kafka::is_transient(error) {
        // The client retries it; a job that has to wait says so once.
        tracing::debug!(
            error = %redact(&error.to_string()),
            reason = %redact(reason),
            "{who}"
        );
        return;
    }
    tracing::error!(
        error = %redact(&error.to_string()),
        reason = %redact(reason),
        "{who}"
    );
}

/// The first error one of a job's clients met that no retry cures, shared by all of
/// them (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub struct ClientWatch {
    inner: Arc<Mutex<WatchState>>,
    /// Set with `fatal`: read on every poll without taking the lock.
    noted: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct WatchState {
    fatal: Option<String>,
    /// Connections closed by the brokers during their first request, before any call
    /// to the cluster succeeded.
    protocol_hints: u32,
    /// A call to the cluster succeeded: the clients speak the listener's protocol, and
    /// a closed connection from now on is a broker going away.
    connected: bool,
}

const AUTH_FAILED: &str = "authentication failed: check sasl.mechanism, sasl.username and sasl.password (or the client certificate)";

/// Whether a failure's reason, as librdkafka words it, is the connection itself going
/// away rather than the broker answering no: librdkafka words those client-side
/// (`Local: ...`), where a broker that refuses a login answers with an error of its own
/// ("SASL authentication error: ...").
fn lost_connection(reason: &str) -> bool {
    ["Local: Broker transport failure", "Local: Timed out"]
        .iter()
        .any(|m| reason.contains(m))
}

const TLS_FAILED: &str = "the TLS handshake failed: check ssl.ca.location (the CA that signed the brokers' certificates), the client certificate and key, and that the listener speaks TLS";

/// A client that connects and is dropped during the protocol's first request again and
/// again is speaking the wrong protocol to that listener (a broker that is shutting
/// down refuses connections instead). librdkafka logs the second such failure within
/// half a second, as "1 identical error(s) suppressed" (later ones only every 30 s).
const PROTOCOL_HINTS: u32 = 2;

impl ClientWatch {
    /// Called with every error a client reports; notes it when no retry can cure it.
    /// Returns whether it is such an error.
    pub fn note(&self, error: &rdkafka::error::KafkaError, reason: &str) -> bool {
        use rdkafka::error::RDKafkaErrorCode as Code;
        let mut state = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let code = error.rdkafka_error_code();
        let cause = match code {
            // librdkafka also reports a connection lost during the SASL handshake (a
            // broker going away) as a failed authentication, with the transport error
            // as its cause: that one is retried.
            Some(Code::Authentication) if lost_connection(reason) => None,
            Some(Code::Authentication | Code::SaslAuthenticationFailed) => Some(AUTH_FAILED),
            Some(Code::SSL) => Some(TLS_FAILED),
            Some(
                Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::TransactionalIdAuthorizationFailed
                | Code::DelegationTokenAuthorizationFailed,
            ) => Some(
                "not authorized: the principal needs ACLs to read the input topics, write the output topics, create and write the changelog topics, use the consumer group and the transactional id",
            ),
            _ => None,
        };
        let Some(cause) = cause else {
            return false;
        };
        self.set_fatal(&mut state, cause, reason);
        true
    }

    /// A connection that failed, as librdkafka logs it (its `FAIL` lines, which come
    /// at once from its own threads, where the error events wait for the client to be
    /// polled): a failed TLS handshake or authentication is noted at once; a
    /// connection closed during its first request counts toward a protocol mismatch.
    pub fn failed_connection(&self, message: &str) {
        if message.contains("SSL handshake failed") || message.contains("certificate verify failed")
        {
            let mut state = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.set_fatal(&mut state, TLS_FAILED, message);
        } else if message.contains("SASL authentication error") && !lost_connection(message) {
            let mut state = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.set_fatal(&mut state, AUTH_FAILED, message);
        } else if message.contains("APIVERSION_QUERY") {
            // librdkafka 2.x words a plaintext client on a TLS listener (and a TLS
            // client on a plaintext one) as a connection closed during its first
            // request.
            self.protocol_hint(message);
        }
    }

    /// A connection the brokers closed during its first request (`reason`, as
    /// librdkafka logs it). Several before any call succeeded mean the listener
    /// speaks another protocol than the client (TLS, SASL or neither).
    pub fn protocol_hint(&self, reason: &str) {
        let mut state = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.connected {
            return;
        }
        // "..., 3 identical error(s) suppressed)": those happened too.
        let suppressed = reason
            .split_once(" identical error(s) suppressed")
            .and_then(|(before, _)| before.rsplit([' ', '(']).next()?.parse::<u32>().ok())
            .unwrap_or(0);
        state.protocol_hints += 1 + suppressed;
        if state.protocol_hints >= PROTOCOL_HINTS {
            let cause = "the brokers close every connection during its first request: the listener most likely expects another security.protocol (SSL, SASL_SSL, SASL_PLAINTEXT or PLAINTEXT) than the client's";
            self.set_fatal(&mut state, cause, reason);
        }
    }

    /// A call to the cluster succeeded.
    pub fn connected(&self) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .connected = true;
    }

    /// Whether a call to the cluster succeeded.
    pub fn is_connected(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .connected
    }

    fn set_fatal(&self, state: &mut WatchState, cause: &str, reason: &str) {
        if state.fatal.is_none() {
            state.fatal = Some(format!("{cause} ({})", redact(reason)));
            self.noted.store(true, Ordering::Release);
        }
    }

    /// The error noted, if any.
    pub fn fatal(&self) -> Option<String> {
        if !self.noted.load(Ordering::Acquire) {
            return None;
        }
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .fatal
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_errors_are_noted_and_outages_are_not() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode as Code};
        let watch = ClientWatch::default();
        assert!(!watch.note(
            &KafkaError::Global(Code::BrokerTransportFailure),
            "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused"
        ));
        assert_eq!(watch.fatal(), None);
        let hint = "127.0.0.1:39194/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN (after 4ms in state APIVERSION_QUERY)";
        for _ in 0..PROTOCOL_HINTS - 1 {
            watch.protocol_hint(hint);
        }
        assert_eq!(watch.fatal(), None, "not after one");
        watch.protocol_hint(hint);
        assert!(
            watch
                .fatal()
                .is_some_and(|f| f.contains("security.protocol"))
        );
        // librdkafka says the repeats once.
        let watch = ClientWatch::default();
        watch.protocol_hint(&hint.replace("QUERY)", "QUERY, 1 identical error(s) suppressed)"));
        assert!(watch.fatal().is_some());
        // Once a call succeeded, a closed connection is a broker going away.
        let watch = ClientWatch::default();
        watch.connected();
        for _ in 0..PROTOCOL_HINTS {
            watch.protocol_hint(hint);
        }
        assert_eq!(watch.fatal(), None);
        let watch = ClientWatch::default();
        assert!(watch.note(
            &KafkaError::Global(Code::Authentication),
            "SASL authentication error: invalid credentials"
        ));
        assert!(
            watch
                .fatal()
                .is_some_and(|f| f.starts_with("authentication failed"))
        );
        // A broker that went away during the handshake refused nothing.
        let watch = ClientWatch::default();
        assert!(!watch.note(
            &KafkaError::Global(Code::Authentication),
            "sasl_ssl://127.0.0.1:29194/1: SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker transport failure: broker's supported mechanisms: (n/a) (after 0ms in state DOWN)"
        ));
        assert_eq!(watch.fatal(), None);
        // A refusal stays one, whatever follows it.
        let watch = ClientWatch::default();
        assert!(watch.note(
            &KafkaError::Global(Code::Authentication),
            "sasl_ssl://127.0.0.1:29194/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 3ms in state AUTH_REQ); Disconnected"
        ));
        // The same, from the client's log lines (they come without a poll).
        let watch = ClientWatch::default();
        watch.failed_connection("sasl_ssl://127.0.0.1:39194/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed (after 9ms in state SSL_HANDSHAKE)");
        assert!(
            watch
                .fatal()
                .is_some_and(|f| f.starts_with("the TLS handshake failed"))
        );
        let watch = ClientWatch::default();
        watch.failed_connection("sasl_ssl://127.0.0.1:39194/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512");
        assert!(
            watch
                .fatal()
                .is_some_and(|f| f.starts_with("authentication failed"))
        );
    }
}
