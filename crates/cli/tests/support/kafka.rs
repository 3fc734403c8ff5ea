//! A real Apache Kafka broker for the tests: started (once, idempotently) by the
//! project's own `scripts/kafka-dev.sh`, KRaft mode on 127.0.0.1. Topics get unique
//! names so that tests run side by side on one broker.

#![allow(dead_code)]

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sessionizer_connectors::kafka::rdkafka;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The bootstrap address of the test broker, started on first use.
/// Held by a test for its whole run: the tests of one file run one at a time. Each
/// starts several sessionizer processes next to the broker; nine of them at once on a
/// two-core machine turn every timeout (group sessions, transactions) into a coin toss.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn broker() -> &'static str {
    static BROKER: OnceLock<String> = OnceLock::new();
    BROKER.get_or_init(|| {
        script(&["start"], false);
        script(&["brokers"], false)
    })
}

/// The brokers of a test binary that stops and restarts them (`scripts/kafka-dev.sh`
/// with `KAFKA_DEV_PORT` and `KAFKA_DEV_NODES`), so that no other binary's broker is
/// touched: set before the first use of [`broker`].
static OWN: OnceLock<(u16, u32)> = OnceLock::new();

/// This test binary's brokers are `nodes` nodes from `port` on (see [`OWN`]). Call it
/// first in every test of the binary, always with the same values.
pub fn own_brokers(port: u16, nodes: u32) {
    let set = OWN.get_or_init(|| (port, nodes));
    assert_eq!(*set, (port, nodes), "one set of brokers per test binary");
}

/// Kills node `n` of this binary's brokers (SIGKILL).
pub fn kill_node(n: u32) {
    script(&["node", &n.to_string(), "kill"], false);
}

/// Stops node `n` of this binary's brokers (SIGTERM: a controlled shutdown).
pub fn stop_node(n: u32) {
    script(&["node", &n.to_string(), "stop"], false);
}

/// Starts node `n` of this binary's brokers and waits until it is ready.
pub fn start_node(n: u32) {
    script(&["node", &n.to_string(), "start"], false);
}

/// Waits until node `n` is back in the in-sync replicas of every partition it holds.
pub fn wait_isr(n: u32) {
    script(&["node", &n.to_string(), "wait-isr", "180"], false);
}

/// Where the tests' brokers keep their jars, data and logs: `SESSIONIZER_TEST_KAFKA_HOME`,
/// or `~/.cache/sessionizer-kafka-tests` — not the home of a broker a developer runs by
/// hand. `scripts/test.sh` empties it (`kafka-dev.sh wipe`) before every run of the suite,
/// so that the brokers start on empty log dirs instead of loading every topic of every
/// earlier run. Their ports are 29092 (plaintext) and 29192 (secure), and the test binaries
/// with brokers of their own pick 29xxx ports too: not `kafka-dev.sh`'s defaults, so that a
/// developer's broker disturbs no test, and below Linux's ephemeral range (32768 and up),
/// so that no client connection of a test can hold a port a broker is about to bind.
pub const TEST_PORT: u16 = 29092;
/// The secure test broker's first port.
pub const TEST_SECURE_PORT: u16 = 29192;

fn test_home() -> String {
    std::env::var("SESSIONIZER_TEST_KAFKA_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cache/sessionizer-kafka-tests",
            std::env::var("HOME").expect("HOME is set")
        )
    })
}

/// Runs `scripts/kafka-dev.sh ARGS` (with `KAFKA_DEV_SECURE=1` when `secure`) on the
/// tests' home; its stdout, trimmed.
fn script(args: &[&str], secure: bool) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka-dev.sh");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(&path).args(args).env("KAFKA_DEV_HOME", test_home());
    if secure {
        cmd.env("KAFKA_DEV_SECURE", "1");
    }
    match OWN.get() {
        Some((port, nodes)) => {
            cmd.env("KAFKA_DEV_PORT", port.to_string())
                .env("KAFKA_DEV_NODES", nodes.to_string());
        }
        None => {
            let port = if secure { TEST_SECURE_PORT } else { TEST_PORT };
            cmd.env("KAFKA_DEV_PORT", port.to_string());
        }
    }
    let out = cmd.output().expect("run scripts/kafka-dev.sh");
    assert!(
        out.status.success(),
        "scripts/kafka-dev.sh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string()
}

/// The secure test broker (`KAFKA_DEV_SECURE=1`, a broker of its own): a plaintext
/// listener for the tests' own admin work, a SASL_SSL one (SCRAM user `sessionizer`)
/// and an SSL one that wants a client certificate.
#[derive(Debug)]
pub struct Secure {
    /// The plaintext listener.
    pub plain: String,
    /// The SASL_SSL listener.
    pub sasl: String,
    /// The SSL listener with client certificates (mTLS).
    pub mtls: String,
    /// librdkafka properties for SASL_SSL with SCRAM-SHA-512, the password included.
    pub sasl_config: Vec<(String, String)>,
    /// librdkafka properties for the mTLS listener.
    pub mtls_config: Vec<(String, String)>,
    /// A CA that did not sign the broker's certificate.
    pub other_ca: String,
    /// A TOML config file for `sessionizer run --config` holding `sasl_config` as its
    /// `kafka-config` (the password in a file, not on the command line).
    pub config_file: std::path::PathBuf,
}

fn key_values(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The secure broker, started on first use.
pub fn secure() -> &'static Secure {
    static SECURE: OnceLock<Secure> = OnceLock::new();
    SECURE.get_or_init(|| {
        script(&["start"], true);
        let sasl_config = key_values(&script(&["client-config", "SCRAM-SHA-512"], true));
        let files = key_values(&script(&["tls-files"], true));
        let other_ca = files
            .iter()
            .find(|(k, _)| k == "other-ca")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("tls-files names other-ca: {files:?}"));
        let config_file =
            std::env::temp_dir().join(format!("sessionizer-secure-{}.toml", std::process::id()));
        let listed: Vec<String> = sasl_config
            .iter()
            .map(|(k, v)| format!("{:?}", format!("{k}={v}")))
            .collect();
        std::fs::write(
            &config_file,
            format!("kafka-config = [{}]\n", listed.join(", ")),
        )
        .expect("write the client config file");
        Secure {
            plain: script(&["brokers"], true),
            sasl: script(&["secure-brokers"], true),
            mtls: script(&["mtls-brokers"], true),
            sasl_config,
            mtls_config: key_values(&script(&["mtls-config"], true)),
            other_ca,
            config_file,
        }
    })
}

/// While it lives, the tests' own clients (topics, producing, reading back) talk to
/// the secure broker's plaintext listener, and [`job_args`] point the job at its
/// SASL_SSL listener with its config file.
pub struct OnSecure(());

impl Drop for OnSecure {
    fn drop(&mut self) {
        *on_secure_slot() = false;
    }
}

fn on_secure_slot() -> std::sync::MutexGuard<'static, bool> {
    static ON: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    ON.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Switches the helpers to the secure broker until the guard drops.
pub fn on_secure() -> OnSecure {
    secure();
    *on_secure_slot() = true;
    OnSecure(())
}

/// The broker the tests' own clients use.
fn admin_broker() -> String {
    if *on_secure_slot() {
        secure().plain.clone()
    } else {
        broker().to_string()
    }
}

/// `--kafka-brokers ...` for a job: the plain broker, or (with [`on_secure`]) the
/// secure broker's SASL_SSL listener and `--config` with its client settings.
pub fn job_args() -> Vec<String> {
    if *on_secure_slot() {
        let s = secure();
        vec![
            "--kafka-brokers".into(),
            s.sasl.clone(),
            "--config".into(),
            s.config_file.display().to_string(),
        ]
    } else {
        vec!["--kafka-brokers".into(), broker().to_string()]
    }
}

/// A topic name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", admin_broker())
        .set("log_level", "3");
    c
}

/// Creates topics with `partitions` partitions each.
pub fn create_topics(names: &[&str], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = config().create().expect("admin client");
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        // The brokers' default: 1, or for a cluster min(nodes, 3) with
        // min.insync.replicas one less (scripts/kafka-dev.sh).
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(-1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let res = futures_block_on(admin.create_topics(topics.iter(), &opts)).expect("create topics");
    for r in res {
        r.expect("topic created");
    }
    // Wait until the metadata shows them.
    let meta: BaseConsumer = config().create().expect("metadata client");
    for n in names {
        let began = Instant::now();
        loop {
            let md = meta
                .fetch_metadata(Some(n), Duration::from_secs(10))
                .expect("metadata");
            if md.topics().iter().any(|t| {
                t.name() == *n && t.error().is_none() && t.partitions().len() as i32 == partitions
            }) {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "topic {n} never appeared"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Deletes a topic.
pub fn delete_topic(name: &str) {
    let admin: AdminClient<DefaultClientContext> = config().create().expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let res = futures_block_on(admin.delete_topics(&[name], &opts)).expect("delete topic");
    for r in res {
        r.expect("topic deleted");
    }
}

fn futures_block_on<F: std::future::Future>(f: F) -> F::Output {
    // A minimal executor: the admin futures complete on librdkafka's own thread.
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Thread(std::thread::Thread);
    impl Wake for Thread {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Thread(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(50)),
        }
    }
}

/// Produces every line of `path` as one record, keyed by the JSON field `key_field`
/// when the line has it (invalid lines get no key), with Kafka's default (murmur2)
/// partitioner as a Java producer would; returns the number of records.
pub fn produce_lines(topic: &str, path: &Path, key_field: &str) -> usize {
    produce(topic, path, Some(key_field), None)
}

/// As [`produce_lines`] with librdkafka's default partitioner (`consistent_random`:
/// CRC-32 of the key), as a Python or Go client built on librdkafka produces.
pub fn produce_lines_crc32(topic: &str, path: &Path, key_field: &str) -> usize {
    produce_with(topic, path, Some(key_field), None, "consistent_random")
}

/// As [`produce_lines`], spread evenly over about `over`: a live input.
pub fn produce_lines_paced(topic: &str, path: &Path, key_field: &str, over: Duration) -> usize {
    produce(topic, path, Some(key_field), Some(over))
}

/// Produces every line of `path` keyed by its line number: records of one visit end up
/// in different partitions (an input not partitioned by the session key).
pub fn produce_lines_unkeyed(topic: &str, path: &Path) -> usize {
    produce(topic, path, None, None)
}

fn produce(topic: &str, path: &Path, key_field: Option<&str>, over: Option<Duration>) -> usize {
    produce_with(topic, path, key_field, over, "murmur2_random")
}

fn produce_with(
    topic: &str,
    path: &Path,
    key_field: Option<&str>,
    over: Option<Duration>,
    partitioner: &str,
) -> usize {
    let producer: BaseProducer = config()
        .set("partitioner", partitioner)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let data = std::fs::read(path).expect("read input");
    // Paced: 50 parts, each sent then a pause.
    const PARTS: usize = 50;
    let lines = data
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let part = lines.div_ceil(PARTS).max(1);
    let mut n = 0;
    for line in data.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        if let Some(over) = over
            && n > 0
            && n % part == 0
        {
            producer.flush(Duration::from_secs(60)).expect("flush");
            std::thread::sleep(over / PARTS as u32);
        }
        let key = match key_field {
            Some(key_field) => serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get(key_field).cloned())
                .and_then(|k| match k {
                    serde_json::Value::String(s) => Some(s),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }),
            None => Some(format!("line-{n}")),
        };
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(line);
        if let Some(k) = &key {
            record = record.key(k.as_bytes());
        }
        send(&producer, record);
        n += 1;
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    n
}

/// Writes `lines` (without keys) to partition `partition` of `topic`, in 20 parts spread
/// evenly over `over`, each part flushed before the pause after it.
pub fn produce_to_partition(topic: &str, lines: &[String], partition: i32, over: Duration) {
    let producer: BaseProducer = config()
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    const PARTS: usize = 20;
    let part = lines.len().div_ceil(PARTS).max(1);
    for (n, line) in lines.iter().enumerate() {
        if n > 0 && n % part == 0 {
            producer.flush(Duration::from_secs(60)).expect("flush");
            std::thread::sleep(over / PARTS as u32);
        }
        let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .payload(line.as_bytes())
            .partition(partition);
        send(&producer, record);
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
}

/// Sends `record`, waiting while the producer's queue is full.
fn send(producer: &BaseProducer, mut record: BaseRecord<'_, [u8], [u8]>) {
    loop {
        match producer.send(record) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(_), back)) => {
                record = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("produce: {e}"),
        }
    }
    producer.poll(Duration::ZERO);
}

/// Writes `per_partition` records to every partition of `topic` (of `partitions`) in
/// one transaction and aborts it: a `read_committed` reader never sees them, but they
/// and the abort marker take offsets.
pub fn produce_aborted(topic: &str, partitions: i32, per_partition: usize) {
    let producer: BaseProducer = config()
        .set("transactional.id", unique("aborting"))
        .create()
        .expect("transactional producer");
    let timeout = Duration::from_secs(30);
    producer
        .init_transactions(timeout)
        .expect("init transactions");
    producer.begin_transaction().expect("begin");
    for p in 0..partitions {
        for i in 0..per_partition {
            let value =
                format!(r#"{{"visit_id":"aborted-{i}","event_time":"2030-01-01T00:00:00Z"}}"#);
            producer
                .send(
                    BaseRecord::to(topic)
                        .partition(p)
                        .key("aborted")
                        .payload(value.as_bytes()),
                )
                .map_err(|(e, _)| e)
                .expect("send");
        }
    }
    producer.flush(timeout).expect("flush");
    producer.abort_transaction(timeout).expect("abort");
}

/// One record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// The `retract` header's value, if any.
    pub retract: Option<String>,
}

/// Every record of `topic` visible to a `read_committed` reader, per partition in
/// offset order, once no transaction on it is open any more: a process killed in the
/// middle of a transaction leaves it open until the broker aborts it (after the
/// transaction timeout), and until then a `read_committed` reader stops before it —
/// also before the later, committed records of other processes.
pub fn read_committed(topic: &str) -> Vec<Vec<Read>> {
    let began = Instant::now();
    loop {
        let (records, settled) = read_all_settled(topic, "read_committed");
        if settled {
            return records;
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "a transaction on {topic} stayed open for 90 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every record of `topic`, aborted ones included, per partition in offset order.
pub fn read_uncommitted(topic: &str) -> Vec<Vec<Read>> {
    read_all(topic, "read_uncommitted")
}

fn read_all(topic: &str, isolation: &str) -> Vec<Vec<Read>> {
    read_all_settled(topic, isolation).0
}

/// The records, and whether every partition was read to its high watermark (no
/// transaction open).
fn read_all_settled(topic: &str, isolation: &str) -> (Vec<Vec<Read>>, bool) {
    let consumer: BaseConsumer = config()
        .set("group.id", "sessionizer-tests")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = md.topics()[0].partitions().len();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = vec![Vec::new(); partitions];
    let mut ended = std::collections::HashSet::new();
    let began = Instant::now();
    while ended.len() < partitions {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "reading {topic} did not reach the end"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("read {topic}: {e}"),
            Some(Ok(m)) => {
                let retract = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "retract")
                        .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
                });
                out[m.partition() as usize].push(Read {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    retract,
                });
            }
        }
    }
    // At its end a read_committed reader stands at the last stable offset; below the
    // high watermark, a transaction is still open. The high watermark must come from a
    // read_uncommitted client: librdkafka asks for offsets with the client's isolation
    // level, and a read_committed one is told the last stable offset instead — then
    // every read looks settled, and committed records behind a killed process's open
    // transaction go unseen.
    let positions = consumer.position().expect("positions");
    let mut settled = true;
    for (p, high) in (0..partitions as i32).zip(high_watermarks(topic, partitions)) {
        let at = positions
            .find_partition(topic, p)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(0);
        if at < high {
            settled = false;
        }
    }
    (out, settled)
}

/// The high watermark of each of the first `partitions` partitions of `topic`: the
/// offset after its last record, committed or not.
pub fn high_watermarks(topic: &str, partitions: usize) -> Vec<i64> {
    end_offsets(topic, partitions, "read_uncommitted")
}

/// The last stable offset of each of the first `partitions` partitions of `topic`: where
/// the first transaction still open starts (the high watermark when none is).
pub fn last_stable_offsets(topic: &str, partitions: usize) -> Vec<i64> {
    end_offsets(topic, partitions, "read_committed")
}

/// The high watermarks of `topic`'s first `partitions` partitions, `None` while the
/// topic is not there (yet).
pub fn high_watermarks_if_there(topic: &str, partitions: usize) -> Option<Vec<i64>> {
    end_offsets_if_there(topic, partitions, "read_uncommitted")
}

/// The last stable offsets of `topic`'s first `partitions` partitions, `None` while a
/// partition does not answer (the topic not there yet, its leader not elected yet).
pub fn last_stable_offsets_if_there(topic: &str, partitions: usize) -> Option<Vec<i64>> {
    end_offsets_if_there(topic, partitions, "read_committed")
}

/// librdkafka asks for a partition's end with the client's isolation level: a
/// `read_committed` client is told the last stable offset, a `read_uncommitted` one the
/// high watermark.
fn end_offsets(topic: &str, partitions: usize, isolation: &str) -> Vec<i64> {
    end_offsets_if_there(topic, partitions, isolation).expect("watermarks")
}

/// [`end_offsets`], `None` while the topic is not there (yet).
fn end_offsets_if_there(topic: &str, partitions: usize, isolation: &str) -> Option<Vec<i64>> {
    let client: BaseConsumer = config()
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    (0..partitions as i32)
        .map(|p| {
            client
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .ok()
                .map(|w| w.1)
        })
        .collect()
}

/// The offsets `group` committed for the first `partitions` partitions of `topic` (-1
/// where none is).
pub fn committed_offsets(group: &str, topic: &str, partitions: usize) -> Vec<i64> {
    let client: BaseConsumer = config().set("group.id", group).create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition(topic, p);
    }
    let got = client
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    (0..partitions as i32)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => -1,
        })
        .collect()
}

/// A record's value as text.
pub fn text(r: &Read) -> String {
    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
}

/// Tells whether a transaction holding records is open on a topic: a high watermark
/// above the last stable offset. Its two clients (one per isolation level) live as long
/// as it does, so that a check is two round trips per partition, quick enough to catch
/// a transaction that is open for a few milliseconds only.
pub struct OpenTransactions {
    topic: String,
    partitions: i32,
    uncommitted: BaseConsumer,
    committed: BaseConsumer,
}

impl OpenTransactions {
    /// A watch over the first `partitions` partitions of `topic`.
    pub fn on(topic: &str, partitions: usize) -> Self {
        let client = |isolation: &str| -> BaseConsumer {
            config()
                .set("isolation.level", isolation)
                .create()
                .expect("consumer")
        };
        OpenTransactions {
            topic: topic.to_string(),
            partitions: partitions as i32,
            uncommitted: client("read_uncommitted"),
            committed: client("read_committed"),
        }
    }

    /// Whether a transaction holding records is open now. The high watermark is read
    /// before the last stable offset, so a transaction committed between the two reads
    /// is not taken for an open one.
    pub fn any(&self) -> bool {
        let end = |client: &BaseConsumer, p: i32| {
            client
                .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                .map(|w| w.1)
                .ok()
        };
        (0..self.partitions).any(|p| match end(&self.uncommitted, p) {
            Some(high) => end(&self.committed, p).is_some_and(|stable| high > stable),
            None => false,
        })
    }
}

/// Kills `child` (SIGKILL) as soon as `due()` says so, unless it exits first: then its
/// exit status and stderr (piped). `None`: it was killed. `due` is asked every 5 ms, for
/// 120 s at most.
pub fn exit_or_kill(
    child: &mut std::process::Child,
    mut due: impl FnMut() -> bool,
) -> Option<(std::process::ExitStatus, String)> {
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                use std::io::Read as _;
                stderr.read_to_string(&mut err).ok();
            }
            return Some((status, err));
        }
        if due() {
            child.kill().expect("kill -9");
            child.wait().expect("reap");
            return None;
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the process neither ended nor came due for its kill in 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a job with `spawn` again and again and kills each run (SIGKILL): the first as
/// soon as a transaction holding records is open on `topic` (so that at least one kill
/// certainly lands mid-transaction), every later one after `wait()`, wherever that
/// falls (start-up, restore, a commit, the last flush) — until a run ends by itself (it
/// must succeed) or `runs` runs were killed. Returns the kills, and whether a run ended
/// by itself.
pub fn kill_repeatedly(
    mut spawn: impl FnMut() -> std::process::Child,
    topic: &str,
    partitions: usize,
    runs: usize,
    mut wait: impl FnMut() -> Duration,
) -> (usize, bool) {
    let open = OpenTransactions::on(topic, partitions);
    for run in 0..runs {
        let mut child = spawn();
        let wait = wait();
        let began = Instant::now();
        let due = || match run {
            0 => open.any(),
            _ => began.elapsed() >= wait,
        };
        if let Some((status, err)) = exit_or_kill(&mut child, due) {
            assert!(status.success(), "the run failed: {err}");
            return (run, true);
        }
    }
    (runs, false)
}

/// Runs `job` with the test hook `SESSIONIZER_TEST_EXIT_BEFORE_KAFKA_COMMIT=n`: it writes
/// its `n`-th checkpoint, then exits (code 86, cleaning nothing up) before committing
/// that checkpoint's Kafka transaction, as a kill at that instant would. Returns its
/// stderr. The hook is in builds with the cargo feature `fault-injection` only.
#[cfg(feature = "fault-injection")]
pub fn exit_before_commit(job: &mut std::process::Command, n: u32) -> String {
    let out = job
        .env("SESSIONIZER_TEST_EXIT_BEFORE_KAFKA_COMMIT", n.to_string())
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(86), "{err}");
    err
}
