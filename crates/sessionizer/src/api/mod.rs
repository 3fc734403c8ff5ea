//! The library's face: the `Stream` builder and the two job styles over your own event
//! types (declarative session windows, stateful functions), their aggregators, sources
//! and sinks, checkpoints, and Kafka (`KafkaJson`, `KafkaJsonSink`, `KafkaGroup`). Every
//! job runs on the runtime (`crate::runtime`); nothing below imports from here.

pub mod aggregators;
pub mod checkpoints;
mod flatten;
pub(crate) mod joined;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod late;
pub(crate) mod records;
pub mod sink;
pub mod source;
pub mod stateful;
pub mod stream;
#[cfg(feature = "delta")]
pub mod table;
pub mod time;
pub mod windowed;
