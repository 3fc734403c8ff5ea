//! What a task's operator emits in a step, encoded and tagged with where each record
//! goes in the merged output: the step of the input that caused it, and for a
//! completion its `(close, key, start)`. With several shards (or tasks) the runtime
//! puts records back in one operator's order by these tags.

use crate::runtime::Place;
use sessionizer_connectors::SessionEncoder;
use sessionizer_core::EventTime;
use sessionizer_window::{Emit, SessionView};

/// The step of the end of input, after every record.
pub(crate) const END_STEP: u64 = u64::MAX;

/// One emitted record: where it goes in the merged output, and where its bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tag {
    pub place: Place,
    /// The key in [`Tagged::keys`].
    pub key: (usize, usize),
    /// The record in [`Tagged::encoder`]'s buffer.
    pub bytes: (usize, usize),
    /// A retraction (else a session record): a Kafka sink writes it as a tombstone.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub retract: bool,
}

/// An [`Emit`] that encodes and, with several shards, tags every record.
#[derive(Debug)]
pub(crate) struct Tagged {
    pub encoder: SessionEncoder,
    pub tags: Vec<Tag>,
    pub keys: Vec<u8>,
    /// Complete session records among them (for the emission delay).
    pub completed: u64,
    pub tagging: bool,
    pub step: u64,
    /// A Kafka sink keys each record's message by its key (a stateful function's
    /// outputs), not by the session id of its key and start.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub by_key: bool,
}

impl Tagged {
    fn tag(&mut self, place: Place, key: &[u8], from: usize, retract: bool) {
        if !self.tagging {
            return;
        }
        let k = (self.keys.len(), key.len());
        self.keys.extend_from_slice(key);
        self.tags.push(Tag {
            place,
            key: k,
            bytes: (from, self.encoder.buf.len() - from),
            retract,
        });
    }

    /// An empty buffer for records a library job writes itself (as JSON), tagged for
    /// the Kafka driver with their key and start.
    #[cfg(feature = "kafka")]
    pub fn for_records() -> Tagged {
        Tagged {
            encoder: SessionEncoder::new(&[], sessionizer_window::EmitMode::OnClose),
            tags: Vec::new(),
            keys: Vec::new(),
            completed: 0,
            tagging: true,
            step: 0,
            by_key: false,
        }
    }

    /// As [`for_records`](Self::for_records), for records that are not sessions (a
    /// stateful function's outputs): a Kafka sink keys each message by its key.
    #[cfg(feature = "kafka")]
    pub fn for_keyed_records() -> Tagged {
        Tagged {
            by_key: true,
            ..Tagged::for_records()
        }
    }

    /// Appends one record that `write` writes (one line, without its end), of the
    /// session of `key` starting at `start`: a complete session (counted for the
    /// emission delay), an update of one still open, or (`retract`) a retraction.
    #[cfg(feature = "kafka")]
    pub fn push_with(
        &mut self,
        key: &[u8],
        start: EventTime,
        complete: bool,
        retract: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let from = self.encoder.buf.len();
        write(&mut self.encoder.buf);
        self.encoder.buf.push(b'\n');
        self.encoder.records += 1;
        let place = if retract {
            Place::retraction(self.step, start)
        } else {
            self.completed += u64::from(complete);
            Place::session(self.step, complete, start, start)
        };
        self.tag(place, key, from, retract);
    }

    /// The key bytes of a tag.
    pub fn key(&self, t: &Tag) -> &[u8] {
        &self.keys[t.key.0..t.key.0 + t.key.1]
    }

    pub fn clear(&mut self) {
        self.encoder.buf.clear();
        self.encoder.records = 0;
        self.tags.clear();
        self.keys.clear();
        self.completed = 0;
    }

    /// Drops the first `n` tagged records (written out), keeping the rest.
    pub fn drop_front(&mut self, n: usize) {
        if n == self.tags.len() {
            self.clear();
            return;
        }
        let Some(last) = n.checked_sub(1).map(|i| self.tags[i]) else {
            return;
        };
        let bytes = last.bytes.0 + last.bytes.1;
        let keys = last.key.0 + last.key.1;
        self.encoder.buf.drain(..bytes);
        self.encoder.records -= n as u64;
        self.keys.drain(..keys);
        self.tags.drain(..n);
        for t in &mut self.tags {
            t.bytes.0 -= bytes;
            t.key.0 -= keys;
        }
    }
}

impl Emit for Tagged {
    fn session(&mut self, s: &SessionView<'_>) {
        let from = self.encoder.buf.len();
        self.encoder.session(s);
        self.completed += u64::from(s.complete);
        let place = Place::session(self.step, s.complete, s.close, s.start);
        self.tag(place, s.key, from, false);
    }

    fn retraction(&mut self, key: &[u8], start: EventTime) {
        let from = self.encoder.buf.len();
        self.encoder.retraction(key, start);
        self.tag(Place::retraction(self.step, start), key, from, true);
    }
}

/// A tagged record as the Kafka message of an output topic: the one mapping of a session
/// record (or retraction, or a stateful function's output) to a message.
#[cfg(feature = "kafka")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message<'a> {
    /// The partition the record's key gives (Kafka's murmur2 partitioner): every record
    /// of one key in one partition, in order.
    pub partition: i32,
    /// The session's id in hex (a stateful function's output: its call's key).
    pub key: &'a [u8],
    /// The JSON record without its newline; `None` for a retraction (a tombstone).
    pub value: Option<&'a [u8]>,
    /// A retraction: the message carries the header `retract: true`.
    pub retract: bool,
}

#[cfg(feature = "kafka")]
impl Tagged {
    /// The message of the record `tag` for a topic of `partitions` partitions; its key
    /// is written into `key_buf`.
    pub fn message<'a>(
        &'a self,
        tag: &Tag,
        partitions: usize,
        key_buf: &'a mut Vec<u8>,
    ) -> Message<'a> {
        let key = self.key(tag);
        let record = &self.encoder.buf[tag.bytes.0..tag.bytes.0 + tag.bytes.1];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        key_buf.clear();
        if self.by_key {
            key_buf.extend_from_slice(key);
        } else {
            write_hex(
                sessionizer_window::session_id(key, tag.place.start),
                key_buf,
            );
        }
        Message {
            partition: sessionizer_connectors::kafka::partitioner::partition_for(key, partitions),
            key: key_buf,
            value: (!tag.retract).then_some(record),
            retract: tag.retract,
        }
    }
}

/// `id` as 16 hex digits, as a session record's `session_id`.
#[cfg(feature = "kafka")]
pub(crate) fn write_hex(id: u64, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((id >> (shift * 4)) & 0xf) as usize]);
    }
}
