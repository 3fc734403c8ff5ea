//! The engine side of `sessionizer.spark`: a stateful job over JSON lines whose function
//! is Python code, called per key per micro-batch. The rules are the library's
//! `flat_map_groups_with_state` with Spark's batch rules
//! ([`BatchRules::Spark`]); the Python side (`python/sessionizer/spark.py`)
//! gives the function PySpark's `GroupState`, frames and schemas, and hands back what the
//! call did to the state (kept here as the pickled bytes Python made of it, so that a
//! checkpoint, a restore and a kill -9 keep its types).
//!
//! Everything else runs without the interpreter's lock: reading and parsing the input,
//! the watermark, the batches, timeouts, checkpoints and the output files. The lock is
//! taken for one call and given back after it.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sessionizer::prelude::*;
use sessionizer::stateful::StatefulCounts;
use sessionizer::window::stateful::BatchRules;
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What `spark.py` asks for (JSON).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    inputs: Vec<PathBuf>,
    output: PathBuf,
    late: Option<PathBuf>,
    dead_letters: Option<PathBuf>,
    key: Vec<String>,
    time: Option<String>,
    watermark_delay_ms: Option<i64>,
    batch_size: usize,
    /// `event`, `processing` or `none`.
    timeout: String,
    state_dir: Option<PathBuf>,
}

/// One input record: its key (the grouping fields' values as a JSON array), its event
/// time and all its fields.
#[derive(Debug, Serialize)]
pub struct Row {
    #[serde(skip)]
    key: String,
    #[serde(skip)]
    time: EventTime,
    #[serde(flatten)]
    fields: Map<String, Value>,
}

/// Which fields make the key and the time, for [`Row`]'s decoding: the library's source
/// decodes records with serde's `Deserialize`, which takes no arguments, so the job
/// sets them for its thread before reading.
struct Shape {
    key: Vec<String>,
    time: Option<String>,
}

thread_local! {
    static SHAPE: RefCell<Option<Shape>> = const { RefCell::new(None) };
}

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Row, D::Error> {
        let fields = Map::<String, Value>::deserialize(d)?;
        SHAPE.with(|shape| {
            let shape = shape.borrow();
            let shape = shape.as_ref().expect("the job sets the shape before reading");
            let mut key = Vec::with_capacity(shape.key.len());
            for name in &shape.key {
                match fields.get(name) {
                    Some(v) => key.push(v),
                    None => return Err(D::Error::missing_field(leak(name))),
                }
            }
            let time = match &shape.time {
                // Without a watermark, time plays no part.
                None => EventTime(0),
                Some(name) => match fields.get(name) {
                    None => return Err(D::Error::missing_field(leak(name))),
                    Some(v) => time_of(v).ok_or_else(|| {
                        D::Error::custom(format!(
                            "field {name} is not a time (an RFC 3339 text or epoch milliseconds): {v}"
                        ))
                    })?,
                },
            };
            let key = serde_json::to_string(&key).map_err(D::Error::custom)?;
            Ok(Row { key, time, fields })
        })
    }
}

/// serde's `missing_field` takes a `&'static str`; a job has a handful of field names,
/// leaked once per message (only for records that are refused).
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
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
}

/// The first error of a Python call: the job stops at the end of the batch it came in,
/// and nothing of that batch is written or checkpointed.
type Failure = RefCell<Option<PyErr>>;

/// One call of the Python side: `(outputs, action, state, timeout)` back, applied here.
fn call_python(
    call: &Py<PyAny>,
    key: &str,
    rows: Vec<Row>,
    state: &mut GroupState<'_, Pickled>,
    failure: &Failure,
) -> Vec<Box<RawValue>> {
    if failure.borrow().is_some() {
        return Vec::new();
    }
    let watermark = watermark_ms(state.current_watermark());
    let now = state.current_processing_time().0;
    let result = Python::attach(|py| -> PyResult<Vec<Box<RawValue>>> {
        let rows = PyList::new(py, rows.iter().map(|r| to_py(py, &r.fields)))?;
        let before = state.get().map(|p| PyBytes::new(py, &p.0));
        let args = (
            PyString::new(py, key),
            rows,
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
                RawValue::from_string(line).map_err(|e| {
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
            Python::attach(|py| {
                let note = format!("in the call for key {key}");
                let _ = e.value(py).call_method1("add_note", (note,));
            });
            *failure.borrow_mut() = Some(e);
            Vec::new()
        }
    }
}

/// A JSON value as the Python value `json.loads` would give.
fn to_py<'py>(py: Python<'py>, v: &Map<String, Value>) -> Bound<'py, PyAny> {
    let dict = PyDict::new(py);
    for (k, v) in v {
        let _ = dict.set_item(k, value_to_py(py, v));
    }
    dict.into_any()
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> Bound<'py, PyAny> {
    match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py).map(|o| o.into_any()).expect("an int"),
            (None, Some(u)) => u.into_pyobject(py).map(|o| o.into_any()).expect("an int"),
            _ => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_pyobject(py)
                .map(|o| o.into_any())
                .expect("a float"),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let items: Vec<_> = items.iter().map(|i| value_to_py(py, i)).collect();
            PyList::new(py, items).expect("a list").into_any()
        }
        Value::Object(m) => to_py(py, m),
    }
}

/// Why a run stopped early.
#[derive(Debug)]
pub enum Stop {
    /// The user's function raised: its exception, with the key in a note.
    Python(PyErr),
    /// Reading, writing or checkpointing failed.
    Engine(String),
}

impl<E: std::fmt::Display> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Engine(e.to_string())
    }
}

/// Dead letters: counted by the source, written to a file when one is given.
struct DeadLetters<'a>(Option<&'a mut JsonLinesSink>);

impl Sink<DeadLetter> for DeadLetters<'_> {
    fn send(&mut self, letter: DeadLetter) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => file.send(letter),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => Sink::<DeadLetter>::flush(&mut **file),
            None => Ok(()),
        }
    }
}

/// Rows behind the watermark: counted, written to a file when one is given.
struct LateRows<'a>(Option<&'a mut JsonLinesSink>);

impl Sink<Late<Row>> for LateRows<'_> {
    fn send(&mut self, late: Late<Row>) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => file.send(late),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        match &mut self.0 {
            Some(file) => Sink::<Late<Row>>::flush(&mut **file),
            None => Ok(()),
        }
    }
}

/// Runs the job: reads `options.inputs` in micro-batches of `batch_size` records,
/// calls `call` per key, writes its rows to `options.output`; with a state directory a
/// checkpoint after every micro-batch (outputs exactly once across kills). `stop` ends
/// the run after the micro-batch under way (checkpointed).
pub fn run(call: Py<PyAny>, options: Options, stop: Arc<AtomicBool>) -> Result<Report, Stop> {
    SHAPE.with(|s| {
        *s.borrow_mut() = Some(Shape {
            key: options.key.clone(),
            time: options.time.clone(),
        })
    });
    let watermarks = match options.watermark_delay_ms {
        Some(ms) => Watermarks::Delay(BoundedOutOfOrderness::new(DurationMs(ms))),
        None => Watermarks::Unset,
    };
    let failure: Failure = RefCell::new(None);
    // Spark drops rows behind the watermark only with an event-time timeout.
    let late_policy = if options.timeout == "event" {
        LatePolicy::Drop
    } else {
        LatePolicy::Deliver
    };
    let mut job = Stream::<Row>::new()
        .key_by_ref(|r: &Row| r.key.as_str())
        .event_time(|r: &Row| r.time)
        .watermark(watermarks)
        .flat_map_groups_with_state(
            |key: &str, rows: Vec<Row>, state: &mut GroupState<'_, Pickled>| {
                call_python(&call, key, rows, state, &failure)
            },
        )
        .late_events(late_policy)
        .batch_rules(BatchRules::Spark)
        .build();

    let mut checkpoints = match &options.state_dir {
        Some(dir) => Some(Checkpoints::open(dir)?),
        None => None,
    };
    // Outputs first: a restart cuts them back to their committed lengths.
    let file = |path: &PathBuf, checkpoints: &mut Option<Checkpoints>| match checkpoints {
        Some(c) => JsonLinesSink::exactly_once(path, c),
        None => Ok(JsonLinesSink::file(path)),
    };
    let mut output = file(&options.output, &mut checkpoints)?;
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
    let dead_letters = DeadLetters(dead.as_mut());
    let mut source = match checkpoints.as_mut() {
        Some(c) => JsonLines::<Row, _>::resume(&options.inputs, c, dead_letters)?,
        None => JsonLines::<Row, _>::files(options.inputs.clone(), dead_letters)?,
    };
    let mut late_rows = LateRows(late.as_mut());
    // One micro-batch's rows: written only once its every call has returned.
    let mut rows: Vec<Box<RawValue>> = Vec::new();
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
            job.end_batch(&mut rows)?;
            if let Some(e) = failure.borrow_mut().take() {
                // What the batches before wrote stays; nothing of this one.
                Sink::<Box<RawValue>>::flush(&mut output)?;
                return Err(Stop::Python(e));
            }
            for row in rows.drain(..) {
                output.send(row)?;
            }
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
        job.finish(&mut rows, &mut late_rows)?;
        if let Some(e) = failure.borrow_mut().take() {
            Sink::<Box<RawValue>>::flush(&mut output)?;
            return Err(Stop::Python(e));
        }
        for row in rows.drain(..) {
            output.send(row)?;
        }
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
    Ok(report)
}
