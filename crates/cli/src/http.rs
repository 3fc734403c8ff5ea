//! The HTTP endpoint of `sessionizer run --http-addr ADDR` (docs/semantics.md S-37): a
//! small hyper server on a single-threaded tokio runtime of its own thread, beside the
//! pipeline.
//!
//! | endpoint | answer |
//! | --- | --- |
//! | `GET /metrics` | Prometheus text format: [`Telemetry::encode_metrics`] |
//! | `GET /sessions?key=K` | the key's sessions in progress as JSON, asked of the pipeline between two batches; 404 with `{"key":K,"sessions":[]}` when it holds none; 400 with `{"error":...}` without a key, or for a query that is not valid URL encoding or a key that is not UTF-8 |
//! | `GET /health`, `/health/live` | liveness: 200 while the process runs |
//! | `GET /health/ready` | readiness: 200 once the state is restored and the input is being read, else 503 |
//!
//! Every JSON answer of `/health*` is `{"live":true,"ready":bool,"phase":"..."}`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use sessionizer::telemetry::{METRICS_CONTENT_TYPE, QueryError, Telemetry};
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// How long `/sessions` waits for the pipeline to come between two batches.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The forms `--http-addr` takes, for its errors.
const EXPECTED: &str =
    "expected HOST:PORT (such as 127.0.0.1:9464), or PORT / :PORT for 127.0.0.1:PORT";

/// Why an `--http-addr` is refused; each text ends with the forms it takes.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// A port number above 65535.
    #[error("the port must be at most 65535; {EXPECTED}")]
    PortRange,
    /// Neither a port nor `HOST:PORT`.
    #[error("{EXPECTED}")]
    Form,
    /// A host without a port.
    #[error("no port given; {EXPECTED}")]
    NoPort,
    /// A host name that resolves to no address.
    #[error("the host has no address; {EXPECTED}")]
    NoAddress,
    /// A host name that does not resolve.
    #[error("{0}; {EXPECTED}")]
    Resolve(#[source] std::io::Error),
}

/// Reads `--http-addr`: `HOST:PORT` (an IP address or a name), or `PORT` / `:PORT` for
/// `127.0.0.1:PORT` — the endpoint is local unless a host is named.
pub fn parse_addr(text: &str) -> Result<SocketAddr, AddrError> {
    let t = text.trim();
    let port = t.strip_prefix(':').unwrap_or(t);
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        return port
            .parse::<u16>()
            .map(|p| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), p))
            .map_err(|_| AddrError::PortRange);
    }
    if t.is_empty() || t.starts_with(':') {
        return Err(AddrError::Form);
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !t.contains(':') {
        return Err(AddrError::NoPort);
    }
    match t.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or(AddrError::NoAddress),
        Err(e) => Err(AddrError::Resolve(e)),
    }
}

/// A running endpoint. It serves until the process exits.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
}

impl Server {
    /// The address it listens on (with the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `addr` now (so that a port in use is reported before the run starts) and
/// serves `telemetry` on a thread of its own.
pub fn serve(addr: SocketAddr, telemetry: Telemetry) -> std::io::Result<Server> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    telemetry.accept_queries();
    std::thread::Builder::new()
        .name("sessionizer-http".into())
        .spawn(move || runtime.block_on(accept_loop(listener, telemetry)))?;
    tracing::info!(addr = %local, "http endpoint listening");
    Ok(Server { addr: local })
}

async fn accept_loop(listener: std::net::TcpListener, telemetry: Telemetry) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "http endpoint cannot accept connections");
            return;
        }
    };
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "http endpoint: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let telemetry = telemetry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| respond(req, telemetry.clone()));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn reply_json(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut text = value.to_string();
    text.push('\n');
    reply(status, "application/json", text)
}

fn health(telemetry: &Telemetry) -> serde_json::Value {
    json!({
        "live": true,
        "ready": telemetry.is_ready(),
        "phase": telemetry.phase().as_str(),
    })
}

async fn respond(
    req: Request<Incoming>,
    telemetry: Telemetry,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET {
        let mut r = reply_json(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": "only GET is served"}),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return Ok(r);
    }
    let response = match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            METRICS_CONTENT_TYPE,
            telemetry.encode_metrics(),
        ),
        "/health" | "/health/live" => reply_json(StatusCode::OK, &health(&telemetry)),
        "/health/ready" => {
            let status = if telemetry.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            reply_json(status, &health(&telemetry))
        }
        "/sessions" => match query_value(req.uri().query().unwrap_or(""), "key") {
            Err(e) => reply_json(StatusCode::BAD_REQUEST, &json!({"error": e.to_string()})),
            Ok(None) => reply_json(
                StatusCode::BAD_REQUEST,
                &json!({"error": "name the key: /sessions?key=K (URL-encoded)"}),
            ),
            Ok(Some(key)) => sessions(key, telemetry).await,
        },
        _ => reply_json(
            StatusCode::NOT_FOUND,
            &json!({
                "error": "no such endpoint",
                "endpoints": ["/metrics", "/sessions?key=K", "/health", "/health/ready"],
            }),
        ),
    };
    Ok(response)
}

/// Why a query string cannot be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum QueryStringError {
    /// A `%` not followed by two hex digits.
    #[error(
        "the query is not valid URL encoding: {found:?} is not '%' followed by two hex digits; write a '%' of the key as %25"
    )]
    Escape {
        /// The `%` and what follows it (up to two bytes).
        found: String,
    },
    /// A name or value whose bytes, decoded, are not UTF-8.
    #[error(
        "the query's {what} {raw:?} decodes to bytes that are not UTF-8; keys are text: URL-encode the UTF-8 bytes of each character"
    )]
    NotUtf8 {
        /// `value of key` or `name`.
        what: String,
        /// The text as written in the query.
        raw: String,
    },
}

/// The value of the first `name=value` pair named `name` in a query string
/// (`application/x-www-form-urlencoded`: `+` is a space, `%XX` a byte), `None` when
/// there is none. Every pair is checked: a malformed escape or a name or value that is
/// not UTF-8 is an error, where `form_urlencoded` would decode it into another key
/// (`%ZZ` as itself, bytes that are not UTF-8 as U+FFFD) and answer for that one.
fn query_value(query: &str, name: &str) -> Result<Option<String>, QueryStringError> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n_decoded = decode_component(n).and_then(|b| {
            String::from_utf8(b).map_err(|_| QueryStringError::NotUtf8 {
                what: "parameter name".into(),
                raw: n.into(),
            })
        })?;
        let v_decoded = decode_component(v).and_then(|b| {
            String::from_utf8(b).map_err(|_| QueryStringError::NotUtf8 {
                what: format!("value of {n_decoded}"),
                raw: v.into(),
            })
        })?;
        if found.is_none() && n_decoded == name {
            found = Some(v_decoded);
        }
    }
    Ok(found)
}

/// The bytes of one name or value of a query string.
fn decode_component(text: &str) -> Result<Vec<u8>, QueryStringError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |j: usize| bytes.get(j).and_then(|&b| (b as char).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                    let end = (i + 3).min(bytes.len());
                    return Err(QueryStringError::Escape {
                        found: String::from_utf8_lossy(&bytes[i..end]).into_owned(),
                    });
                };
                out.push((hi * 16 + lo) as u8);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Ok(out)
}

async fn sessions(key: String, telemetry: Telemetry) -> Response<Full<Bytes>> {
    let asked = key.clone();
    // The pipeline answers between two batches: wait for it off the runtime's thread.
    let answer = tokio::task::spawn_blocking(move || telemetry.query(&asked, QUERY_TIMEOUT)).await;
    match answer {
        Ok(Ok(a)) => {
            let status = if a.found {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            reply(status, "application/json", a.json + "\n")
        }
        Ok(Err(e)) => {
            let phase = match &e {
                QueryError::NotRunning(p) => p.as_str(),
                QueryError::TimedOut(_) => "running",
            };
            reply_json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"key": key, "error": e.to_string(), "phase": phase}),
            )
        }
        Err(e) => reply_json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"key": key, "error": e.to_string()}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{QueryStringError, parse_addr, query_value, serve};
    use sessionizer::telemetry::Telemetry;
    use std::time::Duration;

    fn call(addr: &str, method: &str, path: &str) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let url = format!("http://{addr}{path}");
        let mut r = match method {
            "GET" => agent.get(url).call(),
            _ => agent.post(url).send_empty(),
        }
        .expect("request");
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().expect("body"))
    }

    #[test]
    fn readiness_follows_the_run_and_questions_wait_for_the_pipeline() {
        let telemetry = Telemetry::default();
        let server = serve("127.0.0.1:0".parse().unwrap(), telemetry.clone()).expect("serve");
        let addr = server.addr().to_string();
        let get = |path: &str| call(&addr, "GET", path);
        assert_eq!(
            get("/health"),
            (
                200,
                "{\"live\":true,\"phase\":\"starting\",\"ready\":false}\n".into()
            )
        );
        assert_eq!(get("/health/ready").0, 503);
        let (status, body) = get("/sessions?key=k");
        assert_eq!(status, 503);
        assert!(body.contains("\"phase\":\"starting\""), "{body}");
        telemetry.restoring();
        assert_eq!(get("/health/ready").0, 503);
        assert!(get("/health").1.contains("restoring"));
        telemetry.running();
        assert_eq!(get("/health/ready").0, 200);
        assert!(get("/metrics").1.contains("sessionizer_ready 1"));

        // The answer comes from whoever empties the mailbox, as the pipeline does
        // between batches.
        let asking = {
            let addr = addr.clone();
            std::thread::spawn(move || call(&addr, "GET", "/sessions?key=a%2Fb"))
        };
        let mut asked = Vec::new();
        while !asking.is_finished() {
            telemetry.answer_queries(|key| {
                asked.push(key.to_string());
                Vec::new()
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            asking.join().unwrap(),
            (404, "{\"key\":\"a/b\",\"sessions\":[]}\n".into())
        );
        assert_eq!(asked, ["a/b"]);

        assert_eq!(call(&addr, "POST", "/metrics").0, 405);
        assert_eq!(get("/sessions").0, 400);
        telemetry.ended(Ok(&Default::default()));
        assert_eq!(get("/health/ready").0, 503);
        assert_eq!(get("/health").0, 200, "live while the process runs");
    }

    #[test]
    fn a_query_is_decoded_exactly_or_refused_with_what_is_wrong() {
        let key = |q: &str| query_value(q, "key");
        for (query, want) in [
            ("key=a+b", Some("a b")),
            ("key=a%20b", Some("a b")),
            ("key=a%2Bb", Some("a+b")),
            ("key=a%2fb", Some("a/b")),
            ("key=%E2%82%AC", Some("\u{20ac}")),
            ("key=%25ZZ", Some("%ZZ")),
            ("key=", Some("")),
            ("key", Some("")),
            ("&&x=1&key=first&key=second", Some("first")),
            ("x=1", None),
            ("", None),
        ] {
            assert_eq!(key(query), Ok(want.map(String::from)), "{query}");
        }
        for (query, found) in [
            ("key=%ZZ", "%ZZ"),
            ("key=abc%", "%"),
            ("key=%4", "%4"),
            ("key=%4g", "%4g"),
            ("key=a&other=%zz", "%zz"),
            ("%x=1&key=a", "%x"),
        ] {
            let e = key(query).expect_err(query);
            assert_eq!(
                e,
                QueryStringError::Escape {
                    found: found.into()
                },
                "{query}"
            );
            assert!(e.to_string().contains("%25"), "{e}");
        }
        let e = key("key=%FF%FE").expect_err("not UTF-8");
        assert_eq!(
            e.to_string(),
            "the query's value of key \"%FF%FE\" decodes to bytes that are not UTF-8; keys are text: URL-encode the UTF-8 bytes of each character"
        );
        assert!(matches!(
            key("%C3=1"),
            Err(QueryStringError::NotUtf8 { .. })
        ));
    }

    #[test]
    fn a_bare_port_is_local() {
        assert_eq!(parse_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr(":9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(
            parse_addr("127.0.0.1:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
    }

    #[test]
    fn a_named_host_is_kept() {
        assert_eq!(parse_addr("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert_eq!(parse_addr("[::1]:9464").unwrap().to_string(), "[::1]:9464");
        assert!(parse_addr("localhost:9464").unwrap().ip().is_loopback());
    }

    #[test]
    fn bad_addresses_are_refused_with_the_expected_forms() {
        for bad in ["", ":", "70000", ":x", "localhost", "1.2.3.4", "a b:1"] {
            let e = parse_addr(bad).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT"), "{bad:?}: {e}");
        }
    }
}
