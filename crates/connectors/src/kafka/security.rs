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
/// clients that need nothing else of a context (metadata, admin).
#[derive(Debug, Clone)]
pub struct Watched(pub ClientWatch);

impl rdkafka::ClientContext for Watched {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        log_error(&self.0, &error, reason, "Kafka client");
    }
}

impl rdkafka::consumer::ConsumerContext for Watched {}

/// Notes `error` in `watch` and logs it, secrets hidden.
pub fn log_error(watch: &ClientWatch, error: &rdkafka::error::KafkaError, reason: &str, who: &str) {
    watch.note(error, reason);
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
    /// Disconnections that librdkafka attributes to a wrong `security.protocol`.
    protocol_hints: u32,
}

/// A client that connects and is dropped during the protocol's first request several
/// times in a row is speaking the wrong protocol to that listener (a broker that is
/// shutting down refuses connections instead).
const PROTOCOL_HINTS: u32 = 3;

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
            Some(Code::Authentication | Code::SaslAuthenticationFailed) => {
                Some("authentication failed: check sasl.mechanism, sasl.username and sasl.password (or the client certificate)")
            }
            Some(Code::SSL) => Some(
                "the TLS handshake failed: check ssl.ca.location (the CA that signed the brokers' certificates), the client certificate and key, and that the listener speaks TLS",
            ),
            Some(
                Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::TransactionalIdAuthorizationFailed
                | Code::DelegationTokenAuthorizationFailed,
            ) => Some(
                "not authorized: the principal needs ACLs to read the input topics, write the output topics, create and write the changelog topics, use the consumer group and the transactional id",
            ),
            Some(Code::BrokerTransportFailure | Code::AllBrokersDown)
                if reason.contains("security.protocol") =>
            {
                state.protocol_hints += 1;
                (state.protocol_hints >= PROTOCOL_HINTS).then_some(
                    "the brokers close the connection at once: the listener most likely expects another security.protocol (TLS or SASL) than the client's",
                )
            }
            _ => None,
        };
        let Some(cause) = cause else {
            return false;
        };
        if state.fatal.is_none() {
            state.fatal = Some(format!("{cause} ({})", redact(reason)));
            self.noted.store(true, Ordering::Release);
        }
        true
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

