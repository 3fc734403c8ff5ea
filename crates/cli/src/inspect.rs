//! `sessionizer inspect`: what a state directory holds, as text or JSON.
//!
//! It reads the directory without changing it (no temp files removed, no garbage
//! collected), so it is safe next to a running job; a checkpoint being written at that
//! moment is simply not shown yet, and one the job prunes meanwhile is left out.

use crate::args::InspectArgs;
use anyhow::Context;
use serde_json::{Value, json};
use sessionizer_checkpoint::{CheckpointInfo, LoadedState, Manifest, StateDir};
use sessionizer_core::timefmt::format_rfc3339_ms;
use sessionizer_core::{EventTime, Watermark};
use std::io::Write;

/// Writes the report for `args` to `out`: the checkpoints and the newest valid one's
/// positions, watermark and counts; the keys' sessions only with `--keys` or `--key`.
pub fn inspect(args: &InspectArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if let (Some(brokers), Some(group), Some(topic)) =
        (&args.kafka_brokers, &args.kafka_group, &args.kafka_topic)
    {
        return inspect_kafka(args, brokers, group, topic, out);
    }
    let Some(path) = &args.state_dir else {
        anyhow::bail!("give --state-dir DIR, or --kafka-brokers, --kafka-group and --kafka-topic");
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!(
            "cannot inspect {}: it is not a directory; give the --state-dir DIR of a run",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "cannot inspect {}: no such directory; give the --state-dir DIR of a run",
            path.display()
        ),
        Err(e) => anyhow::bail!("cannot inspect {}: {e}", path.display()),
    }
    let dir =
        StateDir::existing(path).with_context(|| format!("cannot inspect {}", path.display()))?;
    let checkpoints = dir.checkpoints()?;
    let newest = checkpoints.iter().find_map(|c| c.status.as_ref().ok());
    let listing = args.keys || args.key.is_some();
    // A library stateful job's checkpoint holds its keys' records, not sessions.
    let stateful = newest.is_some_and(|m| {
        m.options
            .iter()
            .any(|(k, v)| k == "job" && v == "library stateful")
    });
    if let (Some(m), true) = (newest, stateful) {
        let keys = if listing {
            let state = dir
                .load_state(m)
                .map_err(|d| anyhow::anyhow!("checkpoint {}: {d}", m.epoch))?;
            collect_stateful(&state, args.key.as_deref())?
        } else {
            Vec::new()
        };
        return write_stateful(args, path, &checkpoints, m, &keys, out);
    }
    let sessions = match newest {
        Some(m) if listing => {
            let state = dir
                .load_state(m)
                .map_err(|d| anyhow::anyhow!("checkpoint {}: {d}", m.epoch))?;
            collect_sessions(&state, args.key.as_deref())?
        }
        _ => Vec::new(),
    };
    if args.json {
        let mut report = json!({
            "state_dir": path.display().to_string(),
            "checkpoints": checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>(),
            "newest_valid": newest,
            "keys_with_state": newest.map(|m| m.keys),
        });
        if listing {
            report["sessions"] = sessions
                .iter()
                .map(|(k, floor, s)| json!({"key": k, "floor": floor, "sessions": s}))
                .collect();
        }
        // Written as plain bytes, so that a closed stdout is an I/O error like any other.
        let mut text = serde_json::to_vec_pretty(&report)?;
        text.push(b'\n');
        out.write_all(&text)?;
        return Ok(());
    }
    writeln!(out, "state directory {}", path.display())?;
    if checkpoints.is_empty() {
        writeln!(out, "no checkpoints")?;
        return Ok(());
    }
    writeln!(out, "checkpoints, newest first:")?;
    for c in &checkpoints {
        write_checkpoint_line(c, out)?;
    }
    let Some(m) = newest else {
        writeln!(
            out,
            "no valid checkpoint: a run on this directory refuses to start"
        )?;
        return Ok(());
    };
    write_manifest(m, out)?;
    match &args.key {
        Some(k) if sessions.is_empty() => writeln!(out, "key {k:?}: no state")?,
        Some(_) => writeln!(out, "state of the key:")?,
        None if args.keys => writeln!(out, "state of every key ({}):", sessions.len())?,
        None => writeln!(
            out,
            "list the sessions of every key with --keys, or of one with --key K"
        )?,
    }
    for (key, floor, list) in &sessions {
        match floor.as_str() {
            Some(f) => writeln!(out, "  {key:?} (floor {f})")?,
            None => writeln!(
                out,
                "  {key:?} (floor not stored in format 1: a resumed run derives it)"
            )?,
        }
        for s in list {
            writeln!(out, "    {}", session_line(s))?;
        }
    }
    Ok(())
}

fn write_checkpoint_line(c: &CheckpointInfo, out: &mut impl Write) -> std::io::Result<()> {
    match &c.status {
        Ok(m) => {
            let state_bytes: u64 =
                m.base.state_bytes() + m.deltas.iter().map(|d| d.bytes).sum::<u64>();
            let kind = if m.deltas.last().is_some_and(|d| d.epoch == m.epoch) {
                "delta"
            } else {
                "base"
            };
            let stores = &m.base.stores;
            let in_stores = if stores.is_empty() {
                String::new()
            } else {
                format!(
                    " + {} in copies of the RocksDB stores, {} bytes",
                    stores.iter().map(|s| s.keys).sum::<u64>(),
                    m.base.state_bytes() - m.base.bytes
                )
            };
            writeln!(
                out,
                "  {:>6}  {}  {kind:<5}  base {} ({} keys{in_stores}) + {} deltas ({} changed, {} removed); state {} bytes, manifest {} bytes{}",
                c.epoch,
                format_rfc3339_ms(EventTime(
                    i64::try_from(m.created_unix_ms).unwrap_or(i64::MAX)
                )),
                m.base.epoch,
                m.base.puts,
                m.deltas.len(),
                m.deltas.iter().map(|d| d.puts).sum::<u64>(),
                m.deltas.iter().map(|d| d.tombstones).sum::<u64>(),
                state_bytes,
                c.manifest_bytes,
                match (m.finished, m.flushed) {
                    (true, true) => ", end of input (every session emitted)",
                    (true, false) => ", end of input (--keep-open: sessions kept)",
                    _ => "",
                }
            )
        }
        Err(d) => writeln!(out, "  {:>6}  DAMAGED: {d}", c.epoch),
    }
}

fn write_manifest(m: &Manifest, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "newest valid checkpoint {}:", m.epoch)?;
    writeln!(out, "  inputs:")?;
    for i in &m.inputs {
        match i.head_xxh3.strip_prefix("delta-table:") {
            // A Delta table input: its size is its rows, its position a row.
            Some(id) => writeln!(
                out,
                "    {} (Delta table, id {id}): {} of {} rows read",
                i.path, i.line, i.size
            )?,
            None => writeln!(
                out,
                "    {}: {} of {} bytes read, {} lines (head xxh3 {})",
                i.path, i.offset, i.size, i.line, i.head_xxh3
            )?,
        }
    }
    writeln!(out, "  next input sequence number: {}", m.next_seq)?;
    let w = &m.watermark;
    writeln!(
        out,
        "  watermark: {} (largest event time {}, largest gap {} ms)",
        Watermark::at(EventTime(w.watermark_ms)),
        w.max_event_time_ms
            .map_or_else(|| "none".to_string(), |t| format_rfc3339_ms(EventTime(t))),
        w.largest_gap_ms
    )?;
    writeln!(out, "  outputs (committed bytes):")?;
    for o in &m.outputs {
        writeln!(out, "    {:<12} {} {}", o.role, o.path, o.committed_bytes)?;
    }
    for s in &m.staged {
        let rows: u64 = s.files.iter().map(|f| f.rows).sum();
        let bytes: u64 = s.files.iter().map(|f| f.bytes).sum();
        writeln!(
            out,
            "    {:<12} {} (Parquet): {} files of epoch {} staged, {rows} rows, {bytes} bytes",
            s.role,
            s.dir,
            s.files.len(),
            s.epoch
        )?;
    }
    for d in &m.delta {
        writeln!(out, "    {:<12} {}", d.role, delta_line(d))?;
    }
    let c = &m.counters;
    writeln!(
        out,
        "  counts: read {} = in sessions {} + duplicates {} + late {} + invalid {}; blank lines {}; sessions emitted {} (retractions {}); {} bytes read",
        c.records_read,
        c.in_sessions,
        c.duplicates,
        c.late,
        c.invalid,
        c.blank_lines,
        c.sessions_emitted,
        c.retractions,
        c.bytes_read
    )?;
    writeln!(
        out,
        "  keys with state {}, sessions not yet final {}",
        m.keys, m.open_sessions
    )?;
    writeln!(out, "  options:")?;
    for (name, value) in &m.options {
        writeln!(out, "    {name} {value}")?;
    }
    Ok(())
}

/// A checkpoint's (or a Kafka task's) Delta epoch, and whether the table has its commit.
fn delta_line(d: &sessionizer_checkpoint::DeltaEpoch) -> String {
    let rows: u64 = d.files.iter().map(|f| f.rows).sum();
    let bytes: u64 = d.files.iter().map(|f| f.bytes).sum();
    format!(
        "{} (Delta table, application id {}): epoch {}, {} files, {rows} rows, {bytes} bytes; {}",
        d.table,
        d.app_id,
        d.epoch,
        d.files.len(),
        delta_committed(d)
    )
}

/// What the table says of a checkpoint's Delta epoch: whether its commit is there.
#[cfg(feature = "delta")]
fn delta_committed(d: &sessionizer_checkpoint::DeltaEpoch) -> String {
    match sessionizer_connectors::delta::committed_version(&d.table, &d.app_id) {
        Ok((txn, version)) => {
            let version = version.map_or_else(|| "none".to_string(), |v| v.to_string());
            match txn {
                _ if d.files.is_empty() => {
                    format!("no rows in this epoch, nothing to commit (table version {version})")
                }
                Some(t) if t >= d.epoch as i64 => format!(
                    "committed (the table's transaction version for the id is {t}, table version {version})"
                ),
                Some(t) => format!(
                    "not committed yet: the table's transaction version for the id is {t} (table version {version}); the next run commits it"
                ),
                None => format!(
                    "not committed yet: the table has no transaction of the id (table version {version}); the next run commits it"
                ),
            }
        }
        Err(e) => format!("the table cannot be read: {e}"),
    }
}

/// Without the feature `delta` the table is not read.
#[cfg(not(feature = "delta"))]
fn delta_committed(_: &sessionizer_checkpoint::DeltaEpoch) -> String {
    "the table was not read (a build without the feature `delta`)".to_string()
}

fn checkpoint_json(c: &CheckpointInfo) -> Value {
    match &c.status {
        Ok(m) => json!({
            "epoch": c.epoch,
            "valid": true,
            "created": format_rfc3339_ms(EventTime(i64::try_from(m.created_unix_ms).unwrap_or(i64::MAX))),
            "manifest_bytes": c.manifest_bytes,
            "base": m.base,
            "deltas": m.deltas,
            "finished": m.finished,
            "flushed": m.flushed,
        }),
        Err(d) => json!({"epoch": c.epoch, "valid": false, "damage": d.to_string()}),
    }
}

/// Every key's record (or one key's) of a library stateful job's checkpoint, sorted by
/// key, as JSON (`sessionizer_window::stateful::describe_record`).
fn collect_stateful(state: &LoadedState, only: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    state
        .for_each_live_with(sessionizer::pipeline::store_reader(), |key, value| {
            if only.is_some_and(|k| k.as_bytes() != key) {
                return Ok(());
            }
            let record = sessionizer_window::stateful::describe_record(key, value)
                .map_err(|e| anyhow::anyhow!("key {:?}: {e}", String::from_utf8_lossy(key)))?;
            let mut entry = json!({"key": String::from_utf8_lossy(key)});
            if let (Some(e), Some(r)) = (entry.as_object_mut(), record.as_object()) {
                e.extend(r.clone());
            }
            all.push(entry);
            anyhow::Ok(())
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    all.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
    Ok(all)
}

/// The report of a library stateful job's state directory.
fn write_stateful(
    args: &InspectArgs,
    path: &std::path::Path,
    checkpoints: &[CheckpointInfo],
    newest: &sessionizer_checkpoint::Manifest,
    keys: &[Value],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let listing = args.keys || args.key.is_some();
    if args.json {
        let mut report = json!({
            "state_dir": path.display().to_string(),
            "checkpoints": checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>(),
            "newest_valid": newest,
            "keys_with_state": newest.keys,
        });
        if listing {
            report["keys"] = Value::Array(keys.to_vec());
        }
        let mut text = serde_json::to_vec_pretty(&report)?;
        text.push(b'\n');
        out.write_all(&text)?;
        return Ok(());
    }
    writeln!(out, "state directory {}", path.display())?;
    writeln!(out, "checkpoints, newest first:")?;
    for c in checkpoints {
        write_checkpoint_line(c, out)?;
    }
    write_manifest(newest, out)?;
    match &args.key {
        Some(k) if keys.is_empty() => writeln!(out, "key {k:?}: no state")?,
        Some(_) => writeln!(out, "state of the key:")?,
        None if args.keys => writeln!(out, "state of every key ({}):", keys.len())?,
        None => writeln!(
            out,
            "list the state of every key with --keys, or of one with --key K"
        )?,
    }
    for k in keys {
        let mut record = k.clone();
        if let Some(o) = record.as_object_mut() {
            o.remove("key");
        }
        writeln!(out, "  {}: {record}", k["key"])?;
    }
    Ok(())
}

/// Every key's floor and sessions (or one key's), sorted by key, as JSON: the floor as
/// RFC 3339 (`-inf` for minus infinity; `null` in a format-1 checkpoint, which stored
/// none), the sessions as objects.
fn collect_sessions(
    state: &LoadedState,
    only: Option<&str>,
) -> anyhow::Result<Vec<(String, Value, Vec<Value>)>> {
    let mut all = Vec::new();
    let format = state.format_version();
    state
        .for_each_live_with(sessionizer::pipeline::store_reader(), |key, value| {
            if only.is_some_and(|k| k.as_bytes() != key) {
                return Ok(());
            }
            let (floor, sessions) = describe_sessions(key, value, format)
                .map_err(|e| anyhow::anyhow!("key {:?}: {e}", String::from_utf8_lossy(key)))?;
            all.push((String::from_utf8_lossy(key).into_owned(), floor, sessions));
            anyhow::Ok(())
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(all)
}

/// One key's floor (`null` when its checkpoint format stored none) and sessions as JSON:
/// bounds, count, revision, status and the aggregates so far.
fn describe_sessions(
    key: &[u8],
    value: &[u8],
    format: u16,
) -> Result<(Value, Vec<Value>), sessionizer_window::codec::CodecError> {
    let sessions = sessionizer_window::codec::decode_sessions_any(value, format)?;
    let floor = if format == 1 {
        Value::Null
    } else {
        Value::String(Watermark::at(EventTime(sessions.floor())).to_string())
    };
    let mut list: Vec<sessionizer_window::session::SessionRef<'_>> = sessions.sessions().collect();
    list.sort_by_key(|s| s.start());
    let list: Vec<Value> = list
        .into_iter()
        .map(|s| {
            let time = |t: i64| format_rfc3339_ms(EventTime(t));
            let aggregates: Vec<Value> = s
                .aggregates()
                .iter()
                .map(|a| {
                    let mut out = Vec::new();
                    a.write_json(&mut out);
                    serde_json::from_slice(&out).unwrap_or(Value::Null)
                })
                .collect();
            json!({
                "session_id": format!("{:016x}", sessionizer_window::session_id(key, s.start())),
                "start": time(s.start()),
                "end": time(s.last()),
                "close": time(s.close()),
                "event_count": s.event_count(),
                "next_revision": s.next_revision(),
                "emitted": s.emitted(),
                "final": s.is_final(),
                "aggregates": aggregates,
            })
        })
        .collect();
    Ok((floor, list))
}

fn session_line(s: &Value) -> String {
    let status = if s["final"] == true {
        "final (bounds only)"
    } else if s["emitted"] == true {
        "emitted, kept for lateness"
    } else {
        "open"
    };
    let aggregates = s["aggregates"]
        .as_array()
        .map(|a| a.iter().map(Value::to_string).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!(
        "{} {} .. {} (closes {}), {} events, next revision {}, {status}{}{aggregates}",
        s["session_id"].as_str().unwrap_or("?"),
        s["start"].as_str().unwrap_or("?"),
        s["end"].as_str().unwrap_or("?"),
        s["close"].as_str().unwrap_or("?"),
        s["event_count"],
        s["next_revision"],
        if aggregates.is_empty() { "" } else { "; " },
    )
}

/// `sessionizer inspect --kafka-brokers B --kafka-group G --kafka-topic T`: every task of a
/// Kafka job as its changelog holds it — progress (next offset, watermark, counters) and
/// the number of keys; sessions with `--keys` or `--key`.
#[cfg(feature = "kafka")]
fn inspect_kafka(
    args: &InspectArgs,
    brokers: &str,
    group: &str,
    topic: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    use sessionizer_connectors::kafka::KafkaSettings;
    use sessionizer_connectors::kafka::admin::Admin;
    use sessionizer_connectors::kafka::changelog::{Entry, read_to_end};
    use sessionizer_connectors::kafka::partitioner::partition_for;
    let settings = KafkaSettings::new(brokers)
        .properties(crate::kafka::client_properties(&[], &args.kafka_config)?);
    let changelog = format!("{group}-{topic}-changelog");
    let admin = Admin::new(&settings)?;
    let Some(n) = admin.partitions(&changelog)? else {
        anyhow::bail!(
            "job {group} has no changelog topic {changelog}: no task of it has committed yet, or the group or topic is another"
        );
    };
    let parts: Vec<i32> = match (args.partition, &args.key) {
        (Some(p), _) if p < 0 || p as usize >= n => {
            anyhow::bail!("partition {p}: {changelog} has partitions 0..{}", n - 1)
        }
        (Some(p), _) => vec![p],
        // A key lives in the partition its session key gives.
        (None, Some(k)) => vec![partition_for(k.as_bytes(), n)],
        (None, None) => (0..n as i32).collect(),
    };
    let listing = args.keys || args.key.is_some();
    let mut tasks = Vec::new();
    for p in parts {
        let mut meta: Option<Value> = None;
        let mut states: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
        let read = read_to_end(&settings, &changelog, p, None, |e| {
            match e {
                Entry::State {
                    key,
                    value: Some(v),
                } => {
                    states.insert(key.to_vec(), v.to_vec());
                }
                Entry::State { key, value: None } => {
                    states.remove(key);
                }
                Entry::Meta(m) => {
                    meta = Some(serde_json::from_slice(m)?);
                }
            }
            Ok::<(), serde_json::Error>(())
        })?;
        let format =
            meta.as_ref()
                .and_then(|m| m["state_format"].as_u64())
                .unwrap_or(u64::from(sessionizer_checkpoint::FORMAT_VERSION)) as u16;
        let mut sessions = Vec::new();
        if listing {
            for (key, value) in &states {
                if args
                    .key
                    .as_deref()
                    .is_some_and(|k| k.as_bytes() != key.as_slice())
                {
                    continue;
                }
                let (floor, list) = describe_sessions(key, value, format).map_err(|e| {
                    anyhow::anyhow!(
                        "{changelog}/{p}: key {:?}: {e}",
                        String::from_utf8_lossy(key)
                    )
                })?;
                sessions.push(
                    json!({"key": String::from_utf8_lossy(key), "floor": floor, "sessions": list}),
                );
            }
        }
        tasks.push(json!({
            "task": format!("{topic}/{p}"),
            "changelog": format!("{changelog}/{p}"),
            "changelog_records": read.records,
            "changelog_end_offset": read.end_offset,
            "keys_with_state": states.len(),
            "progress": meta,
            "sessions": if listing { Value::Array(sessions) } else { Value::Null },
        }));
    }
    if args.json {
        let mut text =
            serde_json::to_vec_pretty(&json!({"group": group, "topic": topic, "tasks": tasks}))?;
        text.push(b'\n');
        out.write_all(&text)?;
        return Ok(());
    }
    writeln!(
        out,
        "Kafka job {group}, input {topic}, changelog {changelog}"
    )?;
    for t in &tasks {
        let m = &t["progress"];
        writeln!(
            out,
            "task {}: {} keys with state ({} changelog records read)",
            t["task"].as_str().unwrap_or("?"),
            t["keys_with_state"],
            t["changelog_records"]
        )?;
        if m.is_null() {
            writeln!(out, "  no progress committed yet")?;
            continue;
        }
        let w = m["watermark"]["watermark_ms"].as_i64().unwrap_or(i64::MIN);
        writeln!(
            out,
            "  next input offset {}, watermark {}, {} records read ({} in sessions, {} duplicates, {} late, {} invalid), {} sessions emitted{}",
            m["next_offset"],
            Watermark::at(EventTime(w)),
            m["counters"]["records_read"],
            m["counters"]["in_sessions"],
            m["counters"]["duplicates"],
            m["counters"]["late"],
            m["counters"]["invalid"],
            m["counters"]["sessions_emitted"],
            if m["flushed"] == true {
                ", ended (every session emitted)"
            } else {
                ""
            },
        )?;
        // A task writing a Delta table: its last epoch, next to the table's word on it.
        if let Ok(d) =
            serde_json::from_value::<sessionizer_checkpoint::DeltaEpoch>(m["delta"].clone())
        {
            writeln!(out, "  table {}", delta_line(&d))?;
        }
        if let Some(list) = t["sessions"].as_array() {
            for k in list {
                writeln!(
                    out,
                    "  {} (floor {})",
                    k["key"],
                    k["floor"].as_str().unwrap_or("-")
                )?;
                for s in k["sessions"].as_array().into_iter().flatten() {
                    writeln!(out, "    {}", session_line(s))?;
                }
            }
        }
    }
    if !listing {
        writeln!(
            out,
            "list the sessions of every key with --keys, or of one with --key K"
        )?;
    }
    Ok(())
}

/// `inspect --kafka-*` in a build without Kafka.
#[cfg(not(feature = "kafka"))]
fn inspect_kafka(
    _: &InspectArgs,
    _: &str,
    _: &str,
    _: &str,
    _: &mut impl Write,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "this sessionizer was built without Kafka support; build it with `cargo build --release --features kafka`"
    )
}
