//! `sessionizer generate`: a synthetic web-analytics feed of visit events, one JSON object
//! per line, for demos, tests and benchmarks.
//!
//! The model: `--keys` visits are active at once. Each visit has a geometric number of events
//! (mean `--session-length`) spaced by exponential intervals (mean `--mean-interval`). A global
//! simulated clock always advances to the next event of any visit, so the events of different
//! visits interleave in time order. When a visit ends, a new visit with a fresh `visit_id` takes
//! its slot (visit ids never repeat). A share of visits (`--return-fraction`) pause once for a
//! little less or a little more than 30 minutes, so that sessionizing with the default 30m gap
//! shows both merges and splits.
//!
//! On top of that: jitter (`--out-of-order`), late events (`--late-fraction`, `--late-by`),
//! byte-for-byte duplicate lines (`--duplicate-fraction`) and invalid lines
//! (`--invalid-fraction`, cycling through: truncated JSON, a JSON array, missing `visit_id`,
//! null `event_time`, unparseable `event_time`, a time in the year 2500).
//!
//! Counting (the [`GenerateReport`]): `events` is the number of event lines (always
//! `--events`; late events are among them), `duplicates` and `invalid` are extra lines, so the
//! output has `events + duplicates + invalid` lines. The fractions are per event: after each
//! event, with probability `--invalid-fraction` an invalid line follows, and with probability
//! `--duplicate-fraction` a copy of that event's line is written 1 to 8 events later.
//!
//! The output is a pure function of the options: same options, same bytes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use sessionizer_core::timefmt::{parse_duration, parse_timestamp, write_rfc3339_ms};
use sessionizer_core::{DurationMs, EventTime};

/// How `event_time` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GenTimeFormat {
    /// RFC 3339 UTC string with milliseconds: "2024-01-01T00:03:00.250Z".
    Rfc3339,
    /// JSON number of milliseconds since the Unix epoch: 1704067380250.
    EpochMs,
}

/// Options of `sessionizer generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// Number of events to write (duplicate and invalid lines come on top of these).
    #[arg(long, value_name = "N")]
    pub events: u64,

    /// Number of visits active at the same time (concurrent keys).
    #[arg(long, value_name = "K", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,

    /// Seed of the random generator; the same options give the same output, byte for byte.
    #[arg(long, value_name = "S", default_value_t = 42)]
    pub seed: u64,

    /// Where to write the events ("-" for stdout).
    #[arg(long, value_name = "PATH", default_value = "-")]
    pub output: PathBuf,

    /// Time of the first events (RFC 3339).
    #[arg(long, value_name = "TIME", default_value = "2024-01-01T00:00:00Z",
          value_parser = parse_timestamp_arg)]
    pub start: i64,

    /// Mean time between two events of one visit (exponentially distributed).
    #[arg(long, value_name = "DUR", default_value = "20s", value_parser = parse_duration_arg,
          allow_hyphen_values = true)]
    pub mean_interval: i64,

    /// Mean number of events per visit (geometrically distributed, at least 1).
    #[arg(long, value_name = "N", default_value_t = 12.0, value_parser = parse_session_length)]
    pub session_length: f64,

    /// Share of visits that pause once for 26-34 minutes (never exactly 30m) and come back.
    #[arg(long, value_name = "F", default_value_t = 0.05, value_parser = parse_fraction)]
    pub return_fraction: f64,

    /// Largest backwards jitter of event times (uniform in [0, DUR]); 0s keeps times in order.
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = parse_duration_arg,
          allow_hyphen_values = true)]
    pub out_of_order: i64,

    /// Share of events that arrive late: their time is shifted back by about --late-by.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_fraction)]
    pub late_fraction: f64,

    /// How far behind late events are (the shift is uniform in ±10% around this).
    #[arg(long, value_name = "DUR", default_value = "2h", value_parser = parse_duration_arg,
          allow_hyphen_values = true)]
    pub late_by: i64,

    /// Per event, the probability that an exact copy of its line follows 1 to 8 events later.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_fraction)]
    pub duplicate_fraction: f64,

    /// Per event, the probability that an invalid line follows it.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_fraction)]
    pub invalid_fraction: f64,

    /// How event_time is written.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = GenTimeFormat::Rfc3339)]
    pub time_format: GenTimeFormat,

    /// Write the events to this Kafka topic instead of --output, one record per line,
    /// keyed by visit_id (Kafka's default partitioner). Needs --kafka-brokers and a
    /// binary built with --features kafka.
    #[arg(long, value_name = "TOPIC", requires = "kafka_brokers")]
    pub kafka_topic: Option<String>,

    /// Kafka bootstrap servers for --kafka-topic.
    #[arg(long, value_name = "HOSTS", requires = "kafka_topic")]
    pub kafka_brokers: Option<String>,

    /// Extra librdkafka client property KEY=VALUE for --kafka-topic (repeat), e.g.
    /// security settings; also taken from SESSIONIZER_KAFKA_* environment variables
    /// (SESSIONIZER_KAFKA_SASL_PASSWORD is sasl.password), the flag winning per key.
    #[arg(long, value_name = "KEY=VALUE", requires = "kafka_topic")]
    pub kafka_config: Vec<String>,
}

impl GenerateArgs {
    /// The options for `events` events with every other option at its default (the same
    /// defaults as the command line).
    pub fn with_events(events: u64) -> GenerateArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: GenerateArgs,
        }
        let mut args = Wrapper::parse_from(["generate", "--events", "0"]).args;
        args.events = events;
        args
    }

    fn validate(&self) -> Result<(), GenerateError> {
        let fractions = [
            ("--return-fraction", self.return_fraction),
            ("--late-fraction", self.late_fraction),
            ("--duplicate-fraction", self.duplicate_fraction),
            ("--invalid-fraction", self.invalid_fraction),
        ];
        for (name, f) in fractions {
            if !(0.0..=1.0).contains(&f) {
                return Err(GenerateError::Fraction { name, value: f });
            }
        }
        if self.keys == 0 {
            return Err(GenerateError::NoKeys);
        }
        if !(self.session_length >= 1.0 && self.session_length.is_finite()) {
            return Err(GenerateError::SessionLength(self.session_length));
        }
        let durations = [
            ("--mean-interval", self.mean_interval),
            ("--out-of-order", self.out_of_order),
            ("--late-by", self.late_by),
        ];
        for (name, d) in durations {
            if d < 0 {
                return Err(GenerateError::NegativeDuration(name));
            }
        }
        Ok(())
    }
}

/// Why `generate`'s options are refused (each names the option and what it takes).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenerateError {
    /// A fraction outside 0..=1.
    #[error("{name} must be between 0 and 1, got {value}")]
    Fraction {
        /// The option.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// `--keys 0`.
    #[error("--keys must be at least 1")]
    NoKeys,
    /// A session length below 1 (or not finite).
    #[error("--session-length must be at least 1, got {0}")]
    SessionLength(f64),
    /// A negative duration.
    #[error("{0} must not be negative")]
    NegativeDuration(&'static str),
}

/// A `generate` option's value that does not parse (clap shows the text with the
/// option's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// The next option where a duration was expected.
    #[error("that is an option, not a duration: give a value such as 30s")]
    OptionNotDuration,
    /// Not a duration.
    #[error(transparent)]
    Duration(#[from] sessionizer_core::timefmt::DurationError),
    /// Not an RFC 3339 time.
    #[error("{0}; write RFC 3339, e.g. 2024-01-01T00:00:00Z")]
    Timestamp(#[source] sessionizer_core::timefmt::TimeError),
    /// Not a number between 0 and 1.
    #[error("invalid fraction {0:?} (expected a number between 0 and 1)")]
    Fraction(String),
    /// Not a number of at least 1.
    #[error("invalid session length {0:?} (expected a number >= 1)")]
    SessionLength(String),
}

/// What [`generate`] wrote. The output has `events + duplicates + invalid` lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerateReport {
    /// Event lines (valid events; late ones included).
    pub events: u64,
    /// Events among `events` whose time was shifted back by about `--late-by`.
    pub late: u64,
    /// Extra lines that repeat an earlier event line byte for byte.
    pub duplicates: u64,
    /// Extra lines that are not valid events.
    pub invalid: u64,
    /// Distinct visits (visit ids) among the events.
    pub visits: u64,
}

/// Opens `--output` (stdout for "-") and writes the events there.
pub fn run(args: &GenerateArgs) -> io::Result<GenerateReport> {
    if args.output.as_os_str() == "-" {
        let stdout = io::stdout();
        let mut lock = stdout.lock();
        generate(args, &mut lock)
    } else {
        let mut file = std::fs::File::create(&args.output).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create {}: {e}", args.output.display()),
            )
        })?;
        generate(args, &mut file)
    }
}

/// Writes `args.events` visit events (plus the requested duplicate and invalid lines) to `out`,
/// buffered. Deterministic: the same `args` give the same bytes.
pub fn generate(args: &GenerateArgs, out: &mut dyn Write) -> io::Result<GenerateReport> {
    args.validate()
        .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    let mut w = BufWriter::with_capacity(1 << 20, out);
    let mut g = Generator::new(args);
    let mut report = GenerateReport::default();
    let mut line = Vec::with_capacity(1024);
    let mut extra = Vec::with_capacity(1024);
    // Duplicates waiting to be written: (after which event, the line).
    let mut pending: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut spare: Vec<Vec<u8>> = Vec::new();

    for i in 0..args.events {
        let late = g.next_event(&mut line);
        w.write_all(&line)?;
        report.events += 1;
        report.late += u64::from(late);

        if args.invalid_fraction > 0.0 && g.rng.random_bool(args.invalid_fraction) {
            g.invalid_line(report.invalid, &mut extra);
            w.write_all(&extra)?;
            report.invalid += 1;
        }
        if args.duplicate_fraction > 0.0 && g.rng.random_bool(args.duplicate_fraction) {
            let mut copy = spare.pop().unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(&line);
            let due = i + g.rng.random_range(1..=8u64);
            pending.push((due, copy));
        }
        if !pending.is_empty() {
            let mut k = 0;
            while k < pending.len() {
                if pending[k].0 <= i {
                    let (_, copy) = pending.remove(k);
                    w.write_all(&copy)?;
                    report.duplicates += 1;
                    spare.push(copy);
                } else {
                    k += 1;
                }
            }
        }
    }
    for (_, copy) in pending {
        w.write_all(&copy)?;
        report.duplicates += 1;
    }
    report.visits = g.visits_started_with_events;
    w.flush()?;
    Ok(report)
}

// ----------------------------------------------------------------------------------------------
// The visit model.

const MINUTE: i64 = 60_000;
const SITE: &str = "https://shop.example";

/// (country, lang)
const COUNTRIES: &[(&str, &str)] = &[
    ("US", "en-US"),
    ("US", "en-US"),
    ("GB", "en-GB"),
    ("FR", "fr-FR"),
    ("DE", "de-DE"),
    ("ES", "es-ES"),
    ("IT", "it-IT"),
    ("BR", "pt-BR"),
    ("JP", "ja-JP"),
    ("IN", "en-IN"),
    ("CA", "en-CA"),
    ("NL", "nl-NL"),
    ("PL", "pl-PL"),
];

/// (type, os, browser)
const DEVICES: &[(&str, &str, &str)] = &[
    ("mobile", "Android 14", "Chrome 126"),
    ("mobile", "iOS 17.5", "Safari 17"),
    ("mobile", "Android 13", "Samsung Internet 25"),
    ("desktop", "Windows 11", "Chrome 126"),
    ("desktop", "macOS 14.5", "Safari 17"),
    ("desktop", "Windows 10", "Edge 125"),
    ("desktop", "Ubuntu 22.04", "Firefox 127"),
    ("tablet", "iPadOS 17.5", "Safari 17"),
];

const APP_VERSIONS: &[&str] = &["3.14.2", "3.14.1", "3.13.0", "3.12.7"];

/// External referrers of a visit's first page; `None` is direct traffic (JSON null).
const REFERRERS: &[Option<&str>] = &[
    Some("https://www.google.com/"),
    Some("https://www.google.com/"),
    Some("https://www.google.com/"),
    Some("https://www.bing.com/"),
    Some("https://duckduckgo.com/"),
    Some("https://www.facebook.com/"),
    Some("https://t.co/"),
    Some("https://news.ycombinator.com/"),
    None,
    None,
];

const CATEGORIES: &[&str] = &[
    "shoes",
    "shirts",
    "electronics",
    "books",
    "garden",
    "toys",
    "kitchen",
    "sports",
];

const SEARCHES: &[&str] = &[
    "running+shoes",
    "usb-c+cable",
    "linen+shirt",
    "coffee+grinder",
    "lego",
    "yoga+mat",
    "headphones",
    "rust+book",
];

const BLOG_POSTS: &[&str] = &[
    "how-to-choose-running-shoes",
    "summer-sale-2024",
    "gift-ideas-under-50",
    "care-guide-linen",
    "behind-the-scenes",
];

const PLANS: &[&str] = &[
    "free", "free", "free", "free", "free", "free", "free", "pro", "pro", "team",
];

/// One active visit, in one of the K slots.
struct Visit {
    /// `v-000000123-7f3a`
    id: Vec<u8>,
    /// `u-04211`
    user_id: Vec<u8>,
    /// `"context":{...}` (constant for the visit)
    context: Vec<u8>,
    /// The page of the previous event (the referrer of the next one); empty before the first.
    prev_page: Vec<u8>,
    /// The external referrer of the first page.
    first_referrer: Option<&'static str>,
    /// Events still to be written, the next one included.
    remaining: u32,
    /// When `remaining` drops to this value (> 0), the next event comes after a ~30m pause.
    pause_at: u32,
    /// Number of events written so far.
    seq: u32,
}

struct Generator<'a> {
    args: &'a GenerateArgs,
    rng: Pcg64Mcg,
    slots: Vec<Visit>,
    /// (true time of the slot's next event, slot), smallest first.
    heap: BinaryHeap<Reverse<(i64, u32)>>,
    next_visit_no: u64,
    visits_started_with_events: u64,
    event_no: u64,
    id_salt: u64,
    users: u64,
    page: Vec<u8>,
    time_buf: TimeBuf,
    /// The fields of the last event, for the invalid line derived from it.
    last_slot: u32,
    last_time: i64,
}

impl<'a> Generator<'a> {
    fn new(args: &'a GenerateArgs) -> Generator<'a> {
        let mut rng = Pcg64Mcg::seed_from_u64(args.seed);
        let id_salt = rng.random::<u64>();
        let k = args.keys as usize;
        let mut g = Generator {
            args,
            rng,
            slots: Vec::with_capacity(k),
            heap: BinaryHeap::with_capacity(k),
            next_visit_no: 1,
            visits_started_with_events: 0,
            event_no: 0,
            id_salt,
            users: (u64::from(args.keys) * 10).max(1000),
            page: Vec::with_capacity(64),
            time_buf: TimeBuf::default(),
            last_slot: 0,
            last_time: args.start,
        };
        for slot in 0..k {
            let mut v = Visit {
                id: Vec::with_capacity(24),
                user_id: Vec::with_capacity(16),
                context: Vec::with_capacity(256),
                prev_page: Vec::with_capacity(64),
                first_referrer: None,
                remaining: 0,
                pause_at: 0,
                seq: 0,
            };
            g.start_visit(&mut v);
            g.slots.push(v);
            // Spread the first events of the initial visits over one mean interval.
            let offset = g.rng.random_range(0..=args.mean_interval);
            g.heap
                .push(Reverse((args.start.saturating_add(offset), slot as u32)));
        }
        g
    }

    /// Turns `v` into a fresh visit (new id, user, device, length).
    fn start_visit(&mut self, v: &mut Visit) {
        let no = self.next_visit_no;
        self.next_visit_no += 1;
        let rng = &mut self.rng;
        v.id.clear();
        v.id.extend_from_slice(b"v-");
        push_padded(&mut v.id, no, 9);
        v.id.push(b'-');
        push_hex(&mut v.id, u64::from(rng.random::<u16>()), 4);

        let user = rng.random_range(1..=self.users);
        v.user_id.clear();
        v.user_id.extend_from_slice(b"u-");
        push_padded(&mut v.user_id, user, 5);

        // The user's attributes are a function of the user, so they agree across visits.
        let h = mix64(user ^ self.id_salt);
        let (country, lang) = COUNTRIES[(h % COUNTRIES.len() as u64) as usize];
        let plan = PLANS[((h >> 8) % PLANS.len() as u64) as usize];
        let usual_device = ((h >> 24) % DEVICES.len() as u64) as usize;
        let device = if rng.random_range(0..5) == 0 {
            rng.random_range(0..DEVICES.len())
        } else {
            usual_device
        };
        let (dtype, os, browser) = DEVICES[device];
        let version = APP_VERSIONS[rng.random_range(0..APP_VERSIONS.len())];
        let mut ib = itoa::Buffer::new();
        let c = &mut v.context;
        c.clear();
        c.extend_from_slice(b"\"context\":{\"user\":{\"login\":\"user");
        c.extend_from_slice(ib.format(user).as_bytes());
        c.extend_from_slice(b"\",\"country\":\"");
        c.extend_from_slice(country.as_bytes());
        c.extend_from_slice(b"\",\"plan\":\"");
        c.extend_from_slice(plan.as_bytes());
        c.extend_from_slice(b"\"},\"device\":{\"type\":\"");
        c.extend_from_slice(dtype.as_bytes());
        c.extend_from_slice(b"\",\"os\":\"");
        c.extend_from_slice(os.as_bytes());
        c.extend_from_slice(b"\",\"browser\":\"");
        c.extend_from_slice(browser.as_bytes());
        c.extend_from_slice(b"\"},\"app\":{\"version\":\"");
        c.extend_from_slice(version.as_bytes());
        c.extend_from_slice(b"\",\"lang\":\"");
        c.extend_from_slice(lang.as_bytes());
        c.extend_from_slice(b"\"}}");

        v.first_referrer = REFERRERS[rng.random_range(0..REFERRERS.len())];
        v.prev_page.clear();
        v.seq = 0;

        // Geometric number of events with mean L: P(n) = p (1-p)^(n-1), p = 1/L.
        let l = self.args.session_length;
        v.remaining = if l <= 1.0 {
            1
        } else {
            let u: f64 = rng.random();
            let n = 1.0 + ((1.0 - u).ln() / (1.0 - 1.0 / l).ln()).floor();
            n.min(u32::MAX as f64) as u32
        };
        v.pause_at = 0;
        let rf = self.args.return_fraction;
        if rf > 0.0 && rng.random_bool(rf) {
            // A visit picked to pause has at least two events, with the pause between two of them.
            v.remaining = v.remaining.max(2);
            v.pause_at = rng.random_range(1..v.remaining);
        }
    }

    /// Exponential interval with mean `--mean-interval`, in whole milliseconds.
    fn interval(&mut self) -> i64 {
        let mean = self.args.mean_interval as f64;
        if mean <= 0.0 {
            return 0;
        }
        let u: f64 = self.rng.random();
        (-(1.0 - u).ln() * mean).round() as i64
    }

    /// A return after a pause close to the default gap: 26m..29m45s or 30m15s..34m.
    fn pause(&mut self) -> i64 {
        let delta = self.rng.random_range(15_000..=4 * MINUTE);
        if self.rng.random_bool(0.5) {
            30 * MINUTE + delta
        } else {
            30 * MINUTE - delta
        }
    }

    /// Writes the next event into `line` (replacing its contents, newline included).
    /// Returns whether the event is late.
    fn next_event(&mut self, line: &mut Vec<u8>) -> bool {
        let Reverse((t, slot)) = *self.heap.peek().expect("at least one visit slot");
        let mut v = std::mem::replace(&mut self.slots[slot as usize], Visit::placeholder());
        if v.seq == 0 {
            self.visits_started_with_events += 1;
        }

        // The printed time.
        let args = self.args;
        let mut late = false;
        let mut shown = t;
        if args.late_fraction > 0.0 && self.rng.random_bool(args.late_fraction) {
            late = true;
            let spread = args.late_by / 10;
            shown = t - args.late_by - self.rng.random_range(-spread..=spread);
        } else if args.out_of_order > 0 {
            shown = t - self.rng.random_range(0..=args.out_of_order);
        }

        self.choose_page(&v);
        let duration_ms: u32 = self.rng.random_range(200..30_000);
        let event_id = mix48(self.event_no.wrapping_add(self.id_salt));
        self.event_no += 1;

        line.clear();
        write_event(
            line,
            &mut self.time_buf,
            args.time_format,
            &EventFields {
                visit_id: Some(&v.id),
                time: TimeField::Ms(shown),
                user_id: &v.user_id,
                page: &self.page,
                visit: &v,
                event_id,
                duration_ms,
            },
        );

        // Advance the visit.
        v.seq += 1;
        std::mem::swap(&mut v.prev_page, &mut self.page);
        v.remaining -= 1;
        let next = if v.remaining == 0 {
            self.start_visit(&mut v);
            t + self.interval()
        } else if v.remaining == v.pause_at {
            t + self.pause()
        } else {
            t + self.interval()
        };
        self.slots[slot as usize] = v;
        *self.heap.peek_mut().expect("at least one visit slot") = Reverse((next, slot));
        self.last_slot = slot;
        self.last_time = t;
        late
    }

    /// Picks the page of the visit's next event into `self.page`.
    fn choose_page(&mut self, v: &Visit) {
        let rng = &mut self.rng;
        let p = &mut self.page;
        p.clear();
        let first = v.prev_page.is_empty();
        let r = rng.random_range(0..100u32);
        let mut ib = itoa::Buffer::new();
        if first && r < 25 {
            p.push(b'/');
        } else if r < 55 {
            p.extend_from_slice(b"/products/");
            p.extend_from_slice(ib.format(rng.random_range(1..=5000u32)).as_bytes());
        } else if r < 70 {
            p.extend_from_slice(b"/category/");
            p.extend_from_slice(CATEGORIES[rng.random_range(0..CATEGORIES.len())].as_bytes());
        } else if r < 80 {
            p.extend_from_slice(b"/search?q=");
            p.extend_from_slice(SEARCHES[rng.random_range(0..SEARCHES.len())].as_bytes());
        } else if r < 86 {
            p.extend_from_slice(b"/blog/");
            p.extend_from_slice(BLOG_POSTS[rng.random_range(0..BLOG_POSTS.len())].as_bytes());
        } else if r < 92 {
            p.extend_from_slice(b"/cart");
        } else if r < 96 {
            p.extend_from_slice(b"/checkout");
        } else if r < 98 {
            p.extend_from_slice(b"/account/orders");
        } else {
            p.push(b'/');
        }
    }

    /// Writes an invalid line (kind number `n % 6`) derived from the last event into `line`.
    fn invalid_line(&mut self, n: u64, line: &mut Vec<u8>) {
        let args = self.args;
        let t = self.last_time;
        let event_id = mix48(
            self.event_no
                .wrapping_add(self.id_salt)
                .wrapping_add(1 << 47),
        );
        let v = std::mem::replace(
            &mut self.slots[self.last_slot as usize],
            Visit::placeholder(),
        );
        self.choose_page(&v);
        let mut fields = EventFields {
            visit_id: Some(&v.id),
            time: TimeField::Ms(t),
            user_id: &v.user_id,
            page: &self.page,
            visit: &v,
            event_id,
            duration_ms: 1000,
        };
        line.clear();
        match n % 6 {
            0 => {
                // Truncated JSON: a torn write, cut somewhere in the middle.
                write_event(line, &mut self.time_buf, args.time_format, &fields);
                let len = line.len();
                let cut = self.rng.random_range(len / 4..len * 3 / 4);
                line.truncate(cut);
                line.push(b'\n');
            }
            1 => {
                // A JSON array instead of an object.
                line.push(b'[');
                write_event(line, &mut self.time_buf, args.time_format, &fields);
                line.pop(); // newline
                line.extend_from_slice(b"]\n");
            }
            2 => {
                fields.visit_id = None;
                write_event(line, &mut self.time_buf, args.time_format, &fields);
            }
            3 => {
                fields.time = TimeField::Null;
                write_event(line, &mut self.time_buf, args.time_format, &fields);
            }
            4 => {
                fields.time = TimeField::Text("yesterday");
                write_event(line, &mut self.time_buf, args.time_format, &fields);
            }
            _ => {
                // The same instant of the year, in 2500 (past any sane --valid-time-range).
                fields.time = TimeField::Ms(in_year_2500(t));
                write_event(line, &mut self.time_buf, args.time_format, &fields);
            }
        }
        self.slots[self.last_slot as usize] = v;
    }
}

impl Visit {
    fn placeholder() -> Visit {
        Visit {
            id: Vec::new(),
            user_id: Vec::new(),
            context: Vec::new(),
            prev_page: Vec::new(),
            first_referrer: None,
            remaining: 0,
            pause_at: 0,
            seq: 0,
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Formatting (by hand: this is the hot loop).

enum TimeField {
    Ms(i64),
    Null,
    Text(&'static str),
}

struct EventFields<'a> {
    visit_id: Option<&'a [u8]>,
    time: TimeField,
    user_id: &'a [u8],
    page: &'a [u8],
    /// The visit: its previous page or first referrer (the `referrer`), and its `context`.
    visit: &'a Visit,
    event_id: u64,
    duration_ms: u32,
}

fn write_event(out: &mut Vec<u8>, tb: &mut TimeBuf, format: GenTimeFormat, f: &EventFields<'_>) {
    out.push(b'{');
    if let Some(id) = f.visit_id {
        out.extend_from_slice(b"\"visit_id\":\"");
        out.extend_from_slice(id);
        out.extend_from_slice(b"\",");
    }
    out.extend_from_slice(b"\"event_time\":");
    match f.time {
        TimeField::Ms(ms) => match format {
            GenTimeFormat::Rfc3339 => {
                out.push(b'"');
                tb.write_rfc3339_ms(out, ms);
                out.push(b'"');
            }
            GenTimeFormat::EpochMs => {
                out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
            }
        },
        TimeField::Null => out.extend_from_slice(b"null"),
        TimeField::Text(s) => {
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
    }
    out.extend_from_slice(b",\"user_id\":\"");
    out.extend_from_slice(f.user_id);
    out.extend_from_slice(b"\",\"page\":\"");
    out.extend_from_slice(f.page);
    out.extend_from_slice(b"\",\"referrer\":");
    let v = f.visit;
    if !v.prev_page.is_empty() {
        out.push(b'"');
        out.extend_from_slice(SITE.as_bytes());
        out.extend_from_slice(&v.prev_page);
        out.push(b'"');
    } else if let Some(r) = v.first_referrer {
        out.push(b'"');
        out.extend_from_slice(r.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b",\"event_id\":\"e-");
    push_hex(out, f.event_id, 12);
    let mut ib = itoa::Buffer::new();
    out.extend_from_slice(b"\",\"duration_ms\":");
    out.extend_from_slice(ib.format(f.duration_ms).as_bytes());
    out.push(b',');
    out.extend_from_slice(&v.context);
    out.extend_from_slice(b"}\n");
}

fn push_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut ib = itoa::Buffer::new();
    let s = ib.format(n).as_bytes();
    for _ in s.len()..width {
        out.push(b'0');
    }
    out.extend_from_slice(s);
}

fn push_hex(out: &mut Vec<u8>, n: u64, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out.push(HEX[((n >> (i * 4)) & 0xf) as usize]);
    }
}

/// A bijection of the 48-bit numbers (xor-shifts and odd multipliers modulo 2^48): the event
/// ids of `2^48` consecutive inputs are all distinct.
fn mix48(mut z: u64) -> u64 {
    const M: u64 = (1 << 48) - 1;
    z &= M;
    z ^= z >> 24;
    z = z.wrapping_mul(0x9e37_79b9_7f4b) & M;
    z ^= z >> 21;
    z = z.wrapping_mul(0xbf58_476d_1ce5) & M;
    z ^ (z >> 24)
}

/// A bijection of u64 (splitmix64's finalizer).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ----------------------------------------------------------------------------------------------
// Time helpers: thin wrappers over `sessionizer_core::timefmt`.

const MS_PER_DAY: i64 = 86_400_000;

/// The Gregorian calendar repeats every 400 years, which are exactly 146 097 days.
const GREGORIAN_CYCLE_MS: i64 = 146_097 * MS_PER_DAY;

/// clap value parser for durations ([`parse_duration`]): `20s`, `1h30m`, `250ms`, `2d`, and
/// a bare `0`.
fn parse_duration_arg(s: &str) -> Result<i64, ArgError> {
    if s.trim() == "0" {
        return Ok(0);
    }
    // Values may start with '-' (so that `-5m` is refused as negative, not taken for
    // an unknown option); a missing value then takes the next option.
    if s.starts_with("--") {
        return Err(ArgError::OptionNotDuration);
    }
    Ok(parse_duration(s).map(DurationMs::millis)?)
}

/// clap value parser for times ([`parse_timestamp`]): `2024-01-01T00:00:00Z`,
/// `2024-01-01T01:00:00.5+01:00`, a space instead of `T`, no zone meaning UTC. Returns
/// milliseconds since the epoch.
fn parse_timestamp_arg(s: &str) -> Result<i64, ArgError> {
    parse_timestamp(s.as_bytes())
        .map(EventTime::millis)
        .map_err(ArgError::Timestamp)
}

/// Formats RFC 3339 times exactly as core's [`write_rfc3339_ms`], which writes the date part
/// (`YYYY-MM-DDT`) of each new day; consecutive events mostly share their day, and skipping
/// the calendar arithmetic saves about a tenth of the generator's time.
#[derive(Default)]
struct TimeBuf {
    day: Option<i64>,
    date: Vec<u8>,
}

impl TimeBuf {
    /// Appends `ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
    fn write_rfc3339_ms(&mut self, out: &mut Vec<u8>, ms: i64) {
        let day = ms.div_euclid(MS_PER_DAY);
        if self.day != Some(day) {
            self.date.clear();
            write_rfc3339_ms(EventTime(day * MS_PER_DAY), &mut self.date);
            let t = self
                .date
                .iter()
                .position(|&b| b == b'T')
                .map_or(0, |i| i + 1);
            self.date.truncate(t);
            self.day = Some(day);
        }
        out.extend_from_slice(&self.date);
        let in_day = ms.rem_euclid(MS_PER_DAY) as u32;
        let secs = in_day / 1000;
        let milli = in_day % 1000;
        let two = |n: u32| [b'0' + (n / 10) as u8, b'0' + (n % 10) as u8];
        let [h0, h1] = two(secs / 3600);
        let [m0, m1] = two(secs / 60 % 60);
        let [s0, s1] = two(secs % 60);
        let [f1, f2] = two(milli % 100);
        out.extend_from_slice(&[
            h0,
            h1,
            b':',
            m0,
            m1,
            b':',
            s0,
            s1,
            b'.',
            b'0' + (milli / 100) as u8,
            f1,
            f2,
            b'Z',
        ]);
    }
}

/// Start of year `yyyy` (4 ASCII digits) in epoch milliseconds.
fn year_start(yyyy: &[u8]) -> i64 {
    let mut date = [0u8; 10];
    date[..4].copy_from_slice(yyyy);
    date[4..].copy_from_slice(b"-01-01");
    parse_timestamp(&date).map_or(0, EventTime::millis)
}

/// The same instant of the year as `t`, in the year 2500.
fn in_year_2500(t: i64) -> i64 {
    // Move `t` into 2000..2400 by whole 400-year cycles (which keeps its instant of the year),
    // so that its year has four digits.
    let y2000 = year_start(b"2000");
    let t = t - (t - y2000).div_euclid(GREGORIAN_CYCLE_MS) * GREGORIAN_CYCLE_MS;
    let mut text = Vec::with_capacity(24);
    write_rfc3339_ms(EventTime(t), &mut text);
    t - year_start(&text[..4]) + year_start(b"2500")
}

fn parse_fraction(s: &str) -> Result<f64, ArgError> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(ArgError::Fraction(s.to_string())),
    }
}

fn parse_session_length(s: &str) -> Result<f64, ArgError> {
    match s.parse::<f64>() {
        Ok(f) if f >= 1.0 && f.is_finite() => Ok(f),
        _ => Err(ArgError::SessionLength(s.to_string())),
    }
}

#[cfg(test)]
mod tests;
