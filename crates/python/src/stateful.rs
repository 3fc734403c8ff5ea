//! The engine side of `sessionizer.spark`: a stateful job over JSON lines whose function
//! is Python code, called per key per micro-batch. The rules are the library's
//! `flat_map_groups_with_state` with Spark's batch rules
//! ([`BatchRules::Spark`]); the Python side (`python/sessionizer/spark/`)
//! gives the function PySpark's `GroupState`, frames and schemas, and hands back what the
//! call did to the state (kept here as the pickled bytes Python made of it, so that a
//! checkpoint, a restore and a kill -9 keep its types).
//!
//! Everything else runs without the interpreter's lock: reading and parsing the input,
//! the watermark, the batches, timeouts, checkpoints and the output files. The lock is
//! taken for one call and given back after it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sessionizer::prelude::*;
use sessionizer::stateful::StatefulCounts;
use sessionizer::window::stateful::BatchRules;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// What `sessionizer/spark` asks for (JSON): files, or a Kafka topic (`kafka`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    #[serde(default)]
    inputs: Vec<PathBuf>,
    output: Option<PathBuf>,
    late: Option<PathBuf>,
    dead_letters: Option<PathBuf>,
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    kafka: Option<KafkaOptions>,
    key: Vec<String>,
    /// The schema's fields: the others are dropped as a record is read.
    fields: Option<Vec<String>>,
    time: Option<String>,
    watermark_delay_ms: Option<i64>,
    batch_size: usize,
    /// `event`, `processing` or `none`.
    timeout: String,
    state_dir: Option<PathBuf>,
    /// The RocksDB state backend with this memory budget (bytes); in memory without.
    state_memory_bytes: Option<u64>,
}

/// A job on a Kafka topic, as a member of a consumer group (exactly once).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct KafkaOptions {
    brokers: String,
    topic: String,
    group: String,
    output_topic: String,
    dead_letter_topic: Option<String>,
    late_topic: Option<String>,
    instance_id: Option<String>,
    stop_at_end: bool,
    idle_timeout_ms: Option<i64>,
    commit_interval_ms: Option<u64>,
}

/// One input record: its key (the grouping field's text, or the grouping fields' values
/// as a JSON array when there are several), its event
/// time and its fields (those of the schema, when there is one) as compact JSON text —
/// a micro-batch of them waits in memory until its calls, and Python reads each with
/// `json.loads`.
#[derive(Debug)]
pub struct Row {
    key: String,
    time: EventTime,
    json: Box<RawValue>,
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

/// Which fields make the key and the time, for [`Row`]'s decoding: the library's
/// sources decode records with serde's `Deserialize`, which takes no arguments, on
/// threads of their own, so the running job sets them for the process (one stateful
/// job runs at a time: [`RUNNING`]).
struct Shape {
    key: Vec<String>,
    fields: Option<Vec<String>>,
    time: Option<String>,
}

static SHAPE: RwLock<Option<Shape>> = RwLock::new(None);

/// Held by the running stateful job.
static RUNNING: Mutex<()> = Mutex::new(());

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Row, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(d)?;
        {
            let shape = SHAPE.read().unwrap_or_else(|e| e.into_inner());
            let shape = shape
                .as_ref()
                .expect("the job sets the shape before reading");
            let mut key = Vec::with_capacity(shape.key.len());
            for name in &shape.key {
                match fields.get(name) {
                    Some(v) => key.push(v),
                    None => return Err(D::Error::custom(format!("missing field `{name}`"))),
                }
            }
            let time = match &shape.time {
                // Without a watermark, time plays no part.
                None => EventTime(0),
                Some(name) => match fields.get(name) {
                    None => return Err(D::Error::custom(format!("missing field `{name}`"))),
                    Some(v) => time_of(v).ok_or_else(|| {
                        D::Error::custom(format!(
                            "field {name} is not a time (an RFC 3339 text or epoch milliseconds): {v}"
                        ))
                    })?,
                },
            };
            let key = match key.as_slice() {
                // One field: its text, which is also how producers key a Kafka record.
                [Value::String(s)] => s.clone(),
                [v] => v.to_string(),
                values => serde_json::to_string(values).map_err(D::Error::custom)?,
            };
            if let Some(keep) = &shape.fields {
                fields.retain(|name, _| keep.contains(name));
            }
            let json = serde_json::to_string(&fields)
                .and_then(RawValue::from_string)
                .map_err(D::Error::custom)?;
            Ok(Row { key, time, json })
        }
    }
}

/// An event time: epoch milliseconds (an integer) or an RFC 3339 text.
fn time_of(v: &Value) -> Option<EventTime> {
    match v {
        Value::Number(n) => n.as_i64().map(EventTime),
        Value::String(s) => sessionizer::time::parse(s).ok(),
        _ => None,
    }
}

/// A key's state: the bytes Python's pickle made of it (base64 in the checkpoints).
#[derive(Debug, Clone)]
pub struct Pickled(Vec<u8>);

impl Serialize for Pickled {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Pickled {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pickled, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(Pickled)
            .map_err(D::Error::custom)
    }
}

/// The watermark: `delay` behind the largest event time, or none at all (no
/// `withWatermark`: it stays unset and no timeout by event time can fire).
#[derive(Debug, Clone)]
enum Watermarks {
    Delay(BoundedOutOfOrderness),
    Unset,
}

impl WatermarkStrategy for Watermarks {
    fn observe(&mut self, t: EventTime) -> Watermark {
        match self {
            Watermarks::Delay(w) => w.observe(t),
            Watermarks::Unset => Watermark::MIN,
        }
    }

    fn current(&self) -> Watermark {
        match self {
            Watermarks::Delay(w) => w.current(),
            Watermarks::Unset => Watermark::MIN,
        }
    }

    fn resume_at(&mut self, w: Watermark) {
        if let Watermarks::Delay(d) = self {
            WatermarkStrategy::resume_at(d, w);
        }
    }
}

/// A watermark as Python's `GroupState` gives it: Spark's starts at 0 and only rises,
/// so 0 while unset (the first batch) or below the epoch.
fn watermark_ms(w: Watermark) -> i64 {
    w.millis().max(0)
}

/// What one run did, for the statistics.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    records_read: u64,
    dead_letters: u64,
    late: u64,
    batches: u64,
    data_calls: u64,
    timeout_calls: u64,
    outputs: u64,
    resumed_from_checkpoint: Option<u64>,
    stopped_by_signal: bool,
    /// With the RocksDB backend: keys evicted from memory to disk so far.
    keys_evicted: Option<u64>,
}

/// The first error of a Python call: the job stops at the end of the batch it came in,
/// and nothing of that batch is written, committed or checkpointed.
type Failure = Arc<Mutex<Option<PyErr>>>;

fn failed(failure: &Failure) -> bool {
    failure.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

fn take_failure(failure: &Failure) -> Option<PyErr> {
    failure.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// An output of a call: a row, or the failure of the call — which no sink can take, so
/// that a Kafka task, whose sinks encode each output, ends its run there (its
/// transaction is not committed); the file job stops before writing it.
#[derive(Debug)]
pub enum Out {
    Row(Box<RawValue>),
    Failed(String),
}

impl Serialize for Out {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Out::Row(row) => row.serialize(s),
            Out::Failed(why) => Err(serde::ser::Error::custom(why)),
        }
    }
}

/// The Python function, as the job calls it: `(outputs, action, state, timeout)` back,
/// applied here.
#[derive(Clone)]
struct PythonCall {
    call: Arc<Py<PyAny>>,
    failure: Failure,
}

impl PythonCall {
    /// One call of the Python side.
    fn call(&self, key: &str, rows: Vec<Row>, state: &mut GroupState<'_, Pickled>) -> Vec<Out> {
        let (call, failure) = (&self.call, &self.failure);
        if failed(failure) {
            return Vec::new();
        }
        let watermark = watermark_ms(state.current_watermark());
        let now = state.current_processing_time().0;
        let result = Python::attach(|py| -> PyResult<Vec<Out>> {
            let times = PyList::new(py, rows.iter().map(|r| r.time.0))?;
            let rows = PyList::new(py, rows.iter().map(|r| PyString::new(py, r.json.get())))?;
            let before = state.get().map(|p| PyBytes::new(py, &p.0));
            let args = (
                PyString::new(py, key),
                rows,
                times,
                before,
                state.has_timed_out(),
                watermark,
                now,
            );
            let back = call.call1(py, args)?;
            let back = back.bind(py).cast::<PyTuple>()?;
            let outputs: Vec<String> = back.get_item(0)?.extract()?;
            let action: u8 = back.get_item(1)?.extract()?;
            let timeout: Option<(String, i64)> = back.get_item(3)?.extract()?;
            match action {
                0 => {}
                1 => {
                    let after = back.get_item(2)?;
                    let after = after.cast::<PyBytes>()?;
                    state.update(Pickled(after.as_bytes().to_vec()));
                }
                _ => {
                    state.remove();
                }
            }
            match timeout {
                // Spark fires a timeout once the watermark (or the clock) has passed it; the
                // engine once it reaches it: one millisecond later is the same instant.
                Some((kind, at)) if kind == "event" => {
                    state.set_timeout_timestamp(EventTime(at.saturating_add(1)))
                }
                Some((_, duration)) => {
                    state.set_timeout_duration(DurationMs(duration.saturating_add(1)))
                }
                None => {}
            }
            outputs
                .into_iter()
                .map(|line| {
                    RawValue::from_string(line).map(Out::Row).map_err(|e| {
                        pyo3::exceptions::PyValueError::new_err(format!(
                            "an output row is not JSON: {e}"
                        ))
                    })
                })
                .collect()
        });
        match result {
            Ok(outputs) => outputs,
            Err(e) => {
                let why = Python::attach(|py| {
                    let note = format!("in the call for key {key:?}");
                    let value = e.value(py);
                    if value.call_method1("add_note", (&note,)).is_err() {
                        // Python 3.10 has no add_note: the notes the tracebacks of 3.11 print.
                        let _ = value.setattr("__notes__", vec![note]);
                    }
                    traceback_text(py, &e)
                });
                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                vec![Out::Failed(why)]
            }
        }
    }
}

/// The exception as Python prints it (traceback, message, notes).
fn traceback_text(py: Python<'_>, e: &PyErr) -> String {
    let formatted = py.import("traceback").and_then(|tb| {
        tb.call_method1("format_exception", (e.value(py),))?
            .extract::<Vec<String>>()
    });
    match formatted {
        Ok(lines) => format!("the function raised:\n{}", lines.concat().trim_end()),
        Err(_) => format!("the function raised: {e}"),
    }
}

/// Why a run stopped early.
#[derive(Debug)]
pub enum Stop {
    /// The user's function raised: its exception, with the key in a note.
    Python(PyErr),
    /// Reading, writing or checkpointing failed, or the options are not possible.
    Engine(String),
}

impl<E: std::fmt::Display> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Engine(e.to_string())
    }
}

/// Dead letters or late rows: counted where they are found, written to a file when one
/// is given.
struct OptionalFile<'a>(Option<&'a mut JsonLinesSink>);

impl<T: Serialize> Sink<T> for OptionalFile<'_> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => file.send(item),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => Sink::<T>::flush(&mut **file),
            None => Ok(()),
        }
    }
}

/// Runs the job: over files (a checkpoint per micro-batch with a state directory) or a
/// Kafka topic. `stop` ends the run cleanly (after the micro-batch under way,
/// checkpointed or committed). Returns the run's statistics as JSON.
pub fn run(call: Py<PyAny>, options: Options, stop: Arc<AtomicBool>) -> Result<String, Stop> {
    let _running = match RUNNING.try_lock() {
        Ok(guard) => guard,
        // A run that panicked held it: nothing of it runs any more.
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            return Err(Stop::Engine(
                "another stateful job is running in this process; run one at a time".into(),
            ));
        }
    };
    *SHAPE.write().unwrap_or_else(|e| e.into_inner()) = Some(Shape {
        key: options.key.clone(),
        fields: options.fields.clone(),
        time: options.time.clone(),
    });
    let call = PythonCall {
        call: Arc::new(call),
        failure: Arc::new(Mutex::new(None)),
    };
    let result = match &options.kafka {
        #[cfg(feature = "kafka")]
        Some(kafka) => run_kafka(&call, &options, kafka, stop),
        #[cfg(not(feature = "kafka"))]
        Some(_) => Err(Stop::Engine(
            "this build of the package has no Kafka (the wheel's feature kafka)".into(),
        )),
        None => run_files(&call, &options, stop)
            .and_then(|report| serde_json::to_string(&report).map_err(Stop::from)),
    };
    // The function's own exception comes first: the run's error only says it failed.
    match (take_failure(&call.failure), result) {
        (Some(e), _) => Err(Stop::Python(e)),
        (None, result) => result,
    }
}

/// The watermark strategy of `options`.
fn watermarks(options: &Options) -> Watermarks {
    match options.watermark_delay_ms {
        Some(ms) => Watermarks::Delay(BoundedOutOfOrderness::new(DurationMs(ms))),
        None => Watermarks::Unset,
    }
}

/// The state backend of `options`: RocksDB with `state_memory_bytes`.
fn state_backend(options: &Options) -> Result<Option<StateBackend>, Stop> {
    match options.state_memory_bytes {
        None => Ok(None),
        #[cfg(feature = "rocksdb")]
        Some(memory_bytes) => Ok(Some(StateBackend::RocksDb {
            memory_bytes,
            dir: None,
        })),
        #[cfg(not(feature = "rocksdb"))]
        Some(_) => Err(Stop::Engine(
            "this build of the package has no RocksDB state backend (the wheel's feature rocksdb)"
                .into(),
        )),
    }
}

/// Spark drops rows behind the watermark only with an event-time timeout.
fn late_policy(options: &Options) -> LatePolicy {
    if options.timeout == "event" {
        LatePolicy::Drop
    } else {
        LatePolicy::Deliver
    }
}

/// One job, as both the file run and every Kafka task build it.
macro_rules! job {
    ($options:expr, $call:expr, $batching:expr) => {{
        let call = $call;
        Stream::<Row>::new()
            .key_by_ref(|r: &Row| r.key.as_str())
            .event_time(|r: &Row| r.time)
            .watermark(watermarks($options))
            .flat_map_groups_with_state(
                move |key: &str, rows: Vec<Row>, state: &mut GroupState<'_, Pickled>| {
                    call.call(key, rows, state)
                },
            )
            .late_events(late_policy($options))
            .batch_rules(BatchRules::Spark)
            .batching($batching)
            .build()
    }};
}

fn run_files(call: &PythonCall, options: &Options, stop: Arc<AtomicBool>) -> Result<Report, Stop> {
    let Some(output) = &options.output else {
        return Err(Stop::Engine("give an output file".into()));
    };
    let mut job = job!(options, call.clone(), Batching::PerEvent);
    if let Some(backend) = state_backend(options)? {
        job.set_state_backend(&backend)?;
    }

    let mut checkpoints = match &options.state_dir {
        Some(dir) => Some(Checkpoints::open(dir)?),
        None => None,
    };
    // Outputs first: a restart cuts them back to their committed lengths.
    let file = |path: &PathBuf, checkpoints: &mut Option<Checkpoints>| match checkpoints {
        Some(c) => JsonLinesSink::exactly_once(path, c),
        None => Ok(JsonLinesSink::file(path)),
    };
    let mut output = file(output, &mut checkpoints)?;
    let mut late = options
        .late
        .as_ref()
        .map(|p| file(p, &mut checkpoints))
        .transpose()?;
    let mut dead = options
        .dead_letters
        .as_ref()
        .map(|p| file(p, &mut checkpoints))
        .transpose()?;
    let mut report = Report::default();
    if let Some(c) = checkpoints.as_mut() {
        report.resumed_from_checkpoint = job.restore_checkpoint(c)?.map(|r| r.epoch);
    }
    let dead_letters = OptionalFile(dead.as_mut());
    let mut source = match checkpoints.as_mut() {
        Some(c) => JsonLines::<Row, _>::resume(&options.inputs, c, dead_letters)?,
        None => JsonLines::<Row, _>::files(options.inputs.clone(), dead_letters)?,
    };
    let mut late_rows = OptionalFile(late.as_mut());
    // One micro-batch's outputs: written only once its every call has returned.
    let mut outs: Vec<Out> = Vec::new();
    let write = |outs: &mut Vec<Out>, output: &mut JsonLinesSink| -> Result<(), Stop> {
        if failed(&call.failure) {
            // What the batches before wrote stays; nothing of this one.
            Sink::<Box<RawValue>>::flush(output)?;
            return Err(Stop::Engine("the function raised".into()));
        }
        for out in outs.drain(..) {
            if let Out::Row(row) = out {
                output.send(row)?;
            }
        }
        Ok(())
    };
    let size = options.batch_size.max(1);
    let mut in_batch = 0;
    loop {
        let row = source.next();
        let at_end = row.is_none();
        if let Some(row) = row {
            job.push(row, &mut late_rows)?;
            in_batch += 1;
        }
        if in_batch == size || (at_end && in_batch > 0) {
            in_batch = 0;
            job.end_batch(&mut outs)?;
            write(&mut outs, &mut output)?;
            if let Some(c) = checkpoints.as_mut() {
                job.checkpoint(c)?;
            }
            if !at_end && stop.load(Ordering::Acquire) {
                report.stopped_by_signal = true;
                break;
            }
        }
        if at_end {
            break;
        }
    }
    let read = source.finish()?;
    if report.stopped_by_signal {
        Sink::<Late<Row>>::flush(&mut late_rows)?;
    } else {
        // The end of the input: Spark's no-data micro-batch, then every timeout.
        job.finish(&mut outs, &mut late_rows)?;
        write(&mut outs, &mut output)?;
        if let Some(c) = checkpoints.as_mut() {
            job.checkpoint(c)?;
        }
    }
    Sink::<Box<RawValue>>::flush(&mut output)?;
    let counts: StatefulCounts = job.counts();
    report.records_read = read.records;
    report.dead_letters = read.invalid;
    report.late = counts.late;
    report.batches = counts.batches;
    report.data_calls = counts.data_calls;
    report.timeout_calls = counts.timeout_calls;
    report.outputs = counts.outputs;
    report.keys_evicted = job.operator().spill_counts().map(|c| c.evicted);
    Ok(report)
}

/// A member of a consumer group: a job per partition of the topic, its state in
/// changelog topics, its rows to the output topic keyed by the key of their call (the
/// grouping field's text), exactly once; micro-batches of `batch_size`
/// records of a partition (the library's `KafkaGroup::run_stateful`).
#[cfg(feature = "kafka")]
fn run_kafka(
    call: &PythonCall,
    options: &Options,
    kafka: &KafkaOptions,
    stop: Arc<AtomicBool>,
) -> Result<String, Stop> {
    use sessionizer::kafka::KafkaGroup;
    use sessionizer::telemetry::{Quiet, Telemetry};

    if options.output.is_some() || options.late.is_some() || options.dead_letters.is_some() {
        return Err(Stop::Engine(
            "a job on a Kafka topic writes to topics: give output_topic (and dead_letter_topic, late_topic), not files".into(),
        ));
    }
    let telemetry = Telemetry::with_stop(Quiet, stop);
    let mut group = KafkaGroup::new(
        &kafka.brokers,
        &kafka.group,
        &kafka.topic,
        &kafka.output_topic,
    )
    .stop_at_end(kafka.stop_at_end)
    .kafka_properties_from_env()
    .telemetry(&telemetry);
    if let Some(t) = &kafka.dead_letter_topic {
        group = group.dead_letter_topic(t);
    }
    if let Some(t) = &kafka.late_topic {
        group = group.late_topic(t);
    }
    if let Some(id) = &kafka.instance_id {
        group = group.instance_id(id);
    }
    if let Some(ms) = kafka.idle_timeout_ms {
        group = group.idle_timeout(DurationMs(ms));
    }
    if let Some(backend) = state_backend(options)? {
        group = group.state_backend(backend);
    }
    if let Some(ms) = kafka.commit_interval_ms {
        group = group.commit_interval(std::time::Duration::from_millis(ms));
    }
    let batching = Batching::Events(options.batch_size.max(1));
    let stats = group.run_stateful(|| job!(options, call.clone(), batching))?;
    Ok(serde_json::to_string(&stats)?)
}
