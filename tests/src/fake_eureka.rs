//! A fake Eureka server for the Eureka source's tests (`odmesh-control --eureka
//! http://127.0.0.1:PORT/eureka --eureka-interval 0.5`): it serves `GET /eureka/apps` and
//! `GET /eureka/apps/delta` from a registry the test sets, and misbehaves on demand.
//!
//! - The registry: [`FakeEureka::set_instances`] (the harness's [`Instance`]s, as a Eureka
//!   server lists them, with `versions__delta` and `apps__hashcode`) or
//!   [`FakeEureka::set_document`] (any JSON, served as given, e.g. a fixture from
//!   `eureka/testdata/`).
//! - The delta holds, for every instance that changed since the fake started, its latest
//!   change (`ADDED`, `MODIFIED`, `DELETED`), and the hash code of the whole registry, as a
//!   Eureka server's does (it keeps changes for 3 minutes; this one keeps them all: applying
//!   an old change again is harmless). So a client that follows the delta stays in step, and
//!   one that does not falls back to a full fetch.
//! - [`Mode`]s, switched at run time with [`FakeEureka::set_mode`]: normal; down (the
//!   listener is closed and every open connection with it: connections are refused; coming
//!   back binds the same port); hanging (accepts and reads requests, never answers); garbage
//!   ([`Garbage`]: an HTML page, truncated JSON, random bytes, JSON of the wrong shape, a 500
//!   with a body, a body cut off mid-way); empty (the empty registry a restarted Eureka
//!   server has).
//! - It counts the requests it got per path ([`FakeEureka::requests`]), and can wait for more
//!   ([`FakeEureka::wait_requests`]): "the control plane polled twice during the outage".
//!
//! Std threads and blocking sockets, like the rest of the harness; HTTP/1.1 keep-alive, as
//! Eureka clients pool their connections.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::lock;
use crate::registry::Instance;
use crate::serve::{Acceptor, Received, read_request};
use crate::wait::{wait_for, wait_ok};

/// The full registry's path.
pub const APPS_PATH: &str = "/eureka/apps";
/// The delta's path.
pub const DELTA_PATH: &str = "/eureka/apps/delta";
/// How long [`FakeEureka::set_mode`] tries to bind its port again when coming back up.
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection idle this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How the fake answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The registry and its delta.
    Normal,
    /// Not listening: connections are refused, open ones are closed.
    Down,
    /// Accepts and reads requests, never answers; a held request's connection is closed when
    /// the mode changes.
    Hanging,
    /// A useless answer to every request.
    Garbage(Garbage),
    /// The empty registry (`"application": []`, hash code `""`), full and delta: what a
    /// Eureka server that restarted with nothing from its peers holds.
    Empty,
}

/// The useless answers of [`Mode::Garbage`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// 200 with an HTML page (a proxy's login page), `content-type: text/html`.
    Html,
    /// 200, `application/json`, with the first half of the registry's JSON (a whole HTTP
    /// answer whose body is cut).
    TruncatedJson,
    /// 200, `application/json`, with 2 KiB of random bytes.
    RandomBytes,
    /// 200 with a JSON object that is not a registry: no `applications` (what a careless
    /// parser could read as an empty registry).
    WrongShape,
    /// 500 with a JSON error body, as Spring answers.
    ServerError,
    /// 200 whose `content-length` is the registry's, but the connection closes after half.
    CutOff,
}

/// Every [`Garbage`], for tests that try them all.
pub const ALL_GARBAGE: [Garbage; 6] = [
    Garbage::Html,
    Garbage::TruncatedJson,
    Garbage::RandomBytes,
    Garbage::WrongShape,
    Garbage::ServerError,
    Garbage::CutOff,
];

/// A Eureka `GET /eureka/apps` document listing `instances`, grouped by app, with
/// `versions__delta` `version` and the registry's `apps__hashcode`.
pub fn eureka_apps(instances: &[Instance], version: u64) -> Value {
    let mut apps: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for instance in instances {
        apps.entry(instance.eureka_app())
            .or_default()
            .push(instance.to_eureka());
    }
    let application: Vec<Value> = apps
        .into_iter()
        .map(|(name, instance)| json!({"name": name, "instance": instance}))
        .collect();
    let mut document = json!({"applications": {
        "versions__delta": version.to_string(),
        "apps__hashcode": "",
        "application": application,
    }});
    document["applications"]["apps__hashcode"] = Value::String(hash_code(&document));
    document
}

/// Eureka's reconcile hash code of a document's instances: `<STATUS>_<count>_` for each
/// status, in alphabetical order (`DOWN_1_UP_2_`); a missing status counts as `UP`, an
/// unknown one as `UNKNOWN`, as Eureka clients count.
pub fn hash_code(document: &Value) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, instance) in instances_of(document) {
        let status = match instance.get("status").and_then(Value::as_str) {
            None => "UP",
            Some(s @ ("UP" | "DOWN" | "STARTING" | "OUT_OF_SERVICE" | "UNKNOWN")) => s,
            Some(_) => "UNKNOWN",
        };
        *counts.entry(status).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(status, n)| format!("{status}_{n}_"))
        .collect()
}

/// The instances of a document with their app names; `application` and `instance` may be
/// a list or a single object, as Eureka servers write them.
pub(crate) fn instances_of(document: &Value) -> Vec<(String, &Value)> {
    fn list(v: Option<&Value>) -> Vec<&Value> {
        match v {
            Some(Value::Array(items)) => items.iter().collect(),
            Some(item @ Value::Object(_)) => vec![item],
            _ => Vec::new(),
        }
    }
    let mut out = Vec::new();
    for app in list(document.pointer("/applications/application")) {
        let name = app["name"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_uppercase();
        for instance in list(app.get("instance")) {
            out.push((name.clone(), instance));
        }
    }
    out
}

/// An instance's key in the delta: app and instance id (or host name).
fn instance_key(app: &str, instance: &Value) -> (String, String) {
    let id = instance
        .get("instanceId")
        .or_else(|| instance.get("hostName"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    (app.to_owned(), id.to_owned())
}

struct State {
    mode: Mode,
    document: Value,
    /// Bumped on every change of the registry.
    version: u64,
    /// The latest change of every instance that changed: (app, id) → instance with its
    /// `actionType`.
    changes: BTreeMap<(String, String), Value>,
    requests: BTreeMap<String, u64>,
    stopped: bool,
    /// Bumped on every mode change: a hanging request ends when it changes.
    epoch: u64,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes hanging requests (mode changed, or stopped).
    changed: Condvar,
    garbage_seed: AtomicU64,
}

/// A fake Eureka server on a loopback port; stops (closing every connection) when dropped.
pub struct FakeEureka {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Mutex<Option<Acceptor>>,
}

impl FakeEureka {
    /// Starts a fake Eureka server listing `instances`, on a port the OS picks.
    pub fn start(instances: &[Instance]) -> FakeEureka {
        FakeEureka::start_document(eureka_apps(instances, 1))
    }

    /// Starts a fake Eureka server serving `document` (Eureka's `{"applications": ...}`) as
    /// given.
    pub fn start_document(document: Value) -> FakeEureka {
        let mut changes = BTreeMap::new();
        for (app, instance) in instances_of(&document) {
            let mut added = instance.clone();
            added["actionType"] = json!("ADDED");
            changes.insert(instance_key(&app, instance), added);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Normal,
                document,
                version: 1,
                changes,
                requests: BTreeMap::new(),
                stopped: false,
                epoch: 0,
            }),
            changed: Condvar::new(),
            garbage_seed: AtomicU64::new(0x5EED),
        });
        let acceptor = {
            let shared = shared.clone();
            Acceptor::loopback("fake eureka", move |conn| serve(&shared, conn))
        };
        FakeEureka {
            addr: acceptor.addr(),
            shared,
            acceptor: Mutex::new(Some(acceptor)),
        }
    }

    /// Its address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its service URL, `http://127.0.0.1:<port>/eureka`, as `--eureka` takes it.
    pub fn url(&self) -> String {
        format!("http://{}/eureka", self.addr)
    }

    /// Lists `instances` from now on; the delta gets their changes.
    pub fn set_instances(&self, instances: &[Instance]) {
        let version = lock(&self.shared.state).version + 1;
        self.set_document(eureka_apps(instances, version));
    }

    /// Serves `document` from now on, as given; the delta gets the changes of its instances
    /// (by app and `instanceId`) from the previous document.
    pub fn set_document(&self, document: Value) {
        let mut state = lock(&self.shared.state);
        let old: HashMap<(String, String), &Value> = instances_of(&state.document)
            .into_iter()
            .map(|(app, i)| (instance_key(&app, i), i))
            .collect();
        let new: HashMap<(String, String), &Value> = instances_of(&document)
            .into_iter()
            .map(|(app, i)| (instance_key(&app, i), i))
            .collect();
        let mut changes = Vec::new();
        for (key, instance) in &new {
            let action = match old.get(key) {
                None => "ADDED",
                Some(before) if before != instance => "MODIFIED",
                Some(_) => continue,
            };
            let mut change = (*instance).clone();
            change["actionType"] = json!(action);
            changes.push((key.clone(), change));
        }
        for (key, instance) in &old {
            if !new.contains_key(key) {
                let mut change = (*instance).clone();
                change["actionType"] = json!("DELETED");
                changes.push((key.clone(), change));
            }
        }
        state.changes.extend(changes);
        state.version += 1;
        state.document = document;
    }

    /// Switches how it answers; returns once the switch is done (for [`Mode::Down`]: the
    /// port refuses connections and every open one is closed; coming back: it listens on
    /// the same port again).
    pub fn set_mode(&self, mode: Mode) {
        let was = {
            let mut state = lock(&self.shared.state);
            let was = state.mode;
            state.mode = mode;
            state.epoch += 1;
            was
        };
        self.shared.changed.notify_all();
        let mut acceptor = lock(&self.acceptor);
        match (was == Mode::Down, mode == Mode::Down) {
            // Dropping it stops it; hanging requests were woken above.
            (false, true) => drop(acceptor.take()),
            (true, false) => {
                let listener = rebind(self.addr);
                *acceptor = Some(accept(listener, self.shared.clone()));
            }
            _ => {}
        }
    }

    /// How many requests it got for exactly `path` (without the query), in any mode.
    pub fn requests(&self, path: &str) -> u64 {
        lock(&self.shared.state)
            .requests
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Requests for the full registry (`/eureka/apps`, with or without a trailing `/`).
    pub fn full_fetches(&self) -> u64 {
        self.requests(APPS_PATH) + self.requests(&format!("{APPS_PATH}/"))
    }

    /// Requests for the delta (`/eureka/apps/delta`, with or without a trailing `/`).
    pub fn delta_fetches(&self) -> u64 {
        self.requests(DELTA_PATH) + self.requests(&format!("{DELTA_PATH}/"))
    }

    /// Every path it got requests for, with their counts.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.state).requests.clone()
    }

    /// Waits at most `timeout` until it has got `more` requests (full or delta fetches)
    /// after those it had now; returns the counts then. Panics if the time runs out.
    pub fn wait_requests(&self, more: u64, timeout: Duration) -> BTreeMap<String, u64> {
        let fetches = |s: &FakeEureka| s.full_fetches() + s.delta_fetches();
        let target = fetches(self) + more;
        let what = format!(
            "the fake Eureka at {} to get {more} more fetches (it had {:?})",
            self.addr,
            self.request_counts()
        );
        wait_for(timeout, &what, || {
            (fetches(self) >= target).then(|| self.request_counts())
        })
    }
}

impl Drop for FakeEureka {
    fn drop(&mut self) {
        lock(&self.shared.state).stopped = true;
        // Wake hanging requests, then stop (the acceptor waits for every connection).
        self.shared.changed.notify_all();
        drop(lock(&self.acceptor).take());
    }
}

/// Binds `addr` again, retrying while the port is still held (bounded).
fn rebind(addr: SocketAddr) -> TcpListener {
    let what = format!("fake Eureka to listen on {addr} again");
    wait_ok(REBIND_TIMEOUT, &what, || TcpListener::bind(addr))
}

/// Serves `listener` until the acceptor is dropped.
fn accept(listener: TcpListener, shared: Arc<Shared>) -> Acceptor {
    Acceptor::start(listener, "fake eureka", move |conn| serve(&shared, conn))
}

/// What to do with one request.
enum Answer {
    Send {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    /// Say `content-length` of `body`, send half of it, close.
    CutOff(Vec<u8>),
    /// Hold the request until the mode changes (epoch), then close.
    Hang(u64),
    Close,
}

/// Serves one connection until the client closes it or the fake closes it.
fn serve(shared: &Shared, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(IDLE_TIMEOUT));
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Ok(Some(request)) = read_request(&mut reader) {
        let answer = answer(shared, &request);
        let (status, content_type, body) = match answer {
            Answer::Send {
                status,
                content_type,
                body,
            } => (status, content_type, body),
            Answer::CutOff(body) => {
                let mut answer = head(200, "application/json", body.len(), true).into_bytes();
                answer.extend_from_slice(&body[..body.len() / 2]);
                let _ = writer.write_all(&answer);
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Answer::Hang(epoch) => {
                let state = lock(&shared.state);
                drop(
                    shared
                        .changed
                        .wait_while(state, |s| s.epoch == epoch && !s.stopped),
                );
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Answer::Close => {
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
        };
        // One write: a head and body written apart would wait for the client's delayed ACK.
        let mut answer = head(status, content_type, body.len(), request.wants_close()).into_bytes();
        answer.extend_from_slice(&body);
        if writer.write_all(&answer).is_err() {
            return;
        }
        if request.wants_close() {
            return;
        }
    }
}

fn head(status: u16, content_type: &str, length: usize, close: bool) -> String {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        _ => "",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: \
         {length}\r\n{}\r\n",
        if close { "connection: close\r\n" } else { "" }
    )
}

/// Counts the request and decides the answer from the mode and the registry.
fn answer(shared: &Shared, request: &Received) -> Answer {
    let mut state = lock(&shared.state);
    *state.requests.entry(request.path().to_owned()).or_default() += 1;
    let json = |status: u16, value: &Value| Answer::Send {
        status,
        content_type: "application/json",
        body: value.to_string().into_bytes(),
    };
    let path = request.path().trim_end_matches('/');
    let known = path == APPS_PATH || path == DELTA_PATH;
    match state.mode {
        Mode::Down => Answer::Close,
        Mode::Hanging => Answer::Hang(state.epoch),
        _ if request.method != "GET" => json(405, &json!({"error": "the fake Eureka only reads"})),
        _ if !known => json(404, &json!({"error": "not found", "path": request.path()})),
        Mode::Empty => json(200, &eureka_apps(&[], state.version)),
        Mode::Normal if path == APPS_PATH => json(200, &state.document),
        Mode::Normal => json(200, &delta(&state)),
        Mode::Garbage(garbage) => {
            let document = state.document.to_string().into_bytes();
            drop(state);
            garbage_answer(shared, garbage, request, document)
        }
    }
}

/// The delta document: the latest change of every changed instance, and the hash code of
/// the whole registry.
fn delta(state: &State) -> Value {
    let mut apps: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for ((app, _), change) in &state.changes {
        apps.entry(app).or_default().push(change);
    }
    let application: Vec<Value> = apps
        .into_iter()
        .map(|(name, instance)| json!({"name": name, "instance": instance}))
        .collect();
    json!({"applications": {
        "versions__delta": state.version.to_string(),
        "apps__hashcode": hash_code(&state.document),
        "application": application,
    }})
}

fn garbage_answer(
    shared: &Shared,
    garbage: Garbage,
    request: &Received,
    document: Vec<u8>,
) -> Answer {
    let send = |status: u16, content_type: &'static str, body: Vec<u8>| Answer::Send {
        status,
        content_type,
        body,
    };
    match garbage {
        Garbage::Html => send(
            200,
            "text/html",
            b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body><h1>Please \
              sign in</h1><form method=\"post\"><input name=\"user\"></form></body></html>\n"
                .to_vec(),
        ),
        Garbage::TruncatedJson => {
            let half = document[..document.len() / 2].to_vec();
            send(200, "application/json", half)
        }
        Garbage::RandomBytes => {
            let mut seed = shared.garbage_seed.fetch_add(1, Ordering::SeqCst);
            let bytes = (0..2048)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    (seed >> 56) as u8
                })
                .collect();
            send(200, "application/json", bytes)
        }
        Garbage::WrongShape => send(
            200,
            "application/json",
            json!({"status": "UP", "apps": [{"name": "HELLO"}]})
                .to_string()
                .into_bytes(),
        ),
        Garbage::ServerError => send(
            500,
            "application/json",
            json!({
                "timestamp": "2024-05-27T12:00:00.000+00:00",
                "status": 500,
                "error": "Internal Server Error",
                "path": request.path(),
            })
            .to_string()
            .into_bytes(),
        ),
        Garbage::CutOff => Answer::CutOff(document),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Request;
    use std::io;
    use std::thread;
    use std::time::Instant;

    fn get(fake: &FakeEureka, path: &str) -> io::Result<crate::http::Response> {
        Request::get(path)
            .host("eureka")
            .header("accept", "application/json")
            .send_within(fake.addr(), Duration::from_secs(2))
    }

    fn instances_in(document: &Value) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = instances_of(document)
            .into_iter()
            .map(|(app, i)| {
                (
                    app,
                    i["instanceId"].as_str().unwrap_or_default().to_owned(),
                    i["actionType"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn it_serves_the_registry_and_counts_requests_per_path() {
        let fake = FakeEureka::start(&[
            Instance::new("hello", 8080).id("hello-1"),
            Instance::new("hello", 8081).id("hello-2").status("DOWN"),
            Instance::new("pay", 9090).id("pay-1"),
        ]);
        let apps = get(&fake, "/eureka/apps").expect("answer").json();
        assert_eq!(apps["applications"]["apps__hashcode"], "DOWN_1_UP_2_");
        assert_eq!(apps["applications"]["application"][0]["name"], "HELLO");
        assert_eq!(
            apps["applications"]["application"][1]["instance"][0]["instanceId"],
            "pay-1"
        );
        get(&fake, "/eureka/apps/delta").expect("answer");
        get(&fake, "/eureka/apps/delta?regions=x").expect("answer");
        assert_eq!(
            get(&fake, "/eureka/vips/hello").expect("answer").status,
            404
        );
        assert_eq!((fake.full_fetches(), fake.delta_fetches()), (1, 2));
        assert_eq!(fake.requests("/eureka/vips/hello"), 1);
    }

    #[test]
    fn the_delta_lists_each_changed_instance_once_with_the_new_hash_code() {
        let fake = FakeEureka::start(&[
            Instance::new("hello", 8080).id("hello-1"),
            Instance::new("hello", 8081).id("hello-2"),
        ]);
        fake.set_instances(&[
            Instance::new("hello", 8080).id("hello-1"),
            Instance::new("hello", 8081)
                .id("hello-2")
                .status("OUT_OF_SERVICE"),
            Instance::new("pay", 9090).id("pay-1"),
        ]);
        fake.set_instances(&[
            Instance::new("hello", 8081)
                .id("hello-2")
                .status("OUT_OF_SERVICE"),
            Instance::new("pay", 9090).id("pay-1"),
        ]);
        let delta = get(&fake, "/eureka/apps/delta").expect("answer").json();
        assert_eq!(
            delta["applications"]["apps__hashcode"],
            "OUT_OF_SERVICE_1_UP_1_"
        );
        assert_eq!(delta["applications"]["versions__delta"], "3");
        assert_eq!(
            instances_in(&delta),
            vec![
                ("HELLO".into(), "hello-1".into(), "DELETED".into()),
                ("HELLO".into(), "hello-2".into(), "MODIFIED".into()),
                ("PAY".into(), "pay-1".into(), "ADDED".into()),
            ]
        );
        let apps = get(&fake, "/eureka/apps").expect("answer").json();
        assert_eq!(
            apps["applications"]["apps__hashcode"],
            "OUT_OF_SERVICE_1_UP_1_"
        );
    }

    #[test]
    fn a_document_set_as_json_is_served_as_given() {
        let document = json!({"applications": {"versions__delta": "7", "apps__hashcode": "UP_1_",
            "application": {"name": "ONE", "instance": {"instanceId": "one-1", "status": "UP"}}}});
        let fake = FakeEureka::start_document(document.clone());
        assert_eq!(get(&fake, "/eureka/apps").expect("answer").json(), document);
        assert_eq!(hash_code(&document), "UP_1_");
    }

    #[test]
    fn down_refuses_connections_and_closes_open_ones_then_comes_back_on_the_same_port() {
        let fake = FakeEureka::start(&[Instance::new("hello", 8080)]);
        let addr = fake.addr();
        // A kept-alive connection that would otherwise go on being served.
        let mut kept = crate::http::Connection::new(addr);
        let request = Request::get("/eureka/apps").host("eureka");
        assert_eq!(
            kept.send(&request, Duration::from_secs(2))
                .expect("up")
                .status,
            200
        );

        fake.set_mode(Mode::Down);
        let refused = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .expect_err("the port must refuse connections");
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );
        assert!(kept.send(&request, Duration::from_secs(2)).is_err());

        fake.set_mode(Mode::Normal);
        assert_eq!(fake.addr(), addr);
        assert_eq!(get(&fake, "/eureka/apps").expect("back").status, 200);
        assert_eq!(fake.full_fetches(), 2);
    }

    #[test]
    fn hanging_reads_requests_never_answers_and_lets_go_when_the_mode_changes() {
        let fake = FakeEureka::start(&[Instance::new("hello", 8080)]);
        fake.set_mode(Mode::Hanging);
        let error = Request::get("/eureka/apps/delta")
            .host("eureka")
            .send_within(fake.addr(), Duration::from_millis(300))
            .expect_err("no answer");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert_eq!(fake.delta_fetches(), 1);

        // A request held when the mode changes ends with its connection closed.
        let addr = fake.addr();
        let held = thread::spawn(move || {
            Request::get("/eureka/apps")
                .host("eureka")
                .send_within(addr, Duration::from_secs(10))
        });
        crate::wait::wait_until(Duration::from_secs(5), "the request to arrive", || {
            fake.full_fetches() == 1
        });
        let released = Instant::now();
        fake.set_mode(Mode::Normal);
        let result = held.join().expect("client thread");
        assert!(
            result.is_err(),
            "a held request is never answered: {result:?}"
        );
        assert!(released.elapsed() < Duration::from_secs(5));
        assert_eq!(get(&fake, "/eureka/apps").expect("normal").status, 200);
    }

    #[test]
    fn every_garbage_answer_is_useless_as_a_registry() {
        let fake = FakeEureka::start(&[Instance::new("hello", 8080)]);
        for garbage in ALL_GARBAGE {
            fake.set_mode(Mode::Garbage(garbage));
            let result = get(&fake, "/eureka/apps");
            let usable = result.as_ref().is_ok_and(|r| {
                r.status == 200
                    && serde_json::from_slice::<Value>(&r.body)
                        .is_ok_and(|v| v.pointer("/applications/application").is_some())
            });
            assert!(!usable, "{garbage:?} gave a usable registry: {result:?}");
            match garbage {
                Garbage::ServerError => assert_eq!(result.expect("answer").status, 500),
                Garbage::CutOff => {
                    let error = result.expect_err("cut off");
                    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
                }
                Garbage::Html => {
                    let r = result.expect("answer");
                    assert_eq!(r.header("content-type"), Some("text/html"));
                }
                _ => assert_eq!(result.expect("answer").status, 200),
            }
        }
        assert_eq!(fake.full_fetches(), ALL_GARBAGE.len() as u64);
    }

    #[test]
    fn empty_is_the_registry_of_a_restarted_eureka() {
        let fake = FakeEureka::start(&[Instance::new("hello", 8080)]);
        fake.set_mode(Mode::Empty);
        for path in [APPS_PATH, DELTA_PATH] {
            let r = get(&fake, path).expect("answer").json();
            assert_eq!(r["applications"]["application"], json!([]), "{path}");
            assert_eq!(r["applications"]["apps__hashcode"], "", "{path}");
        }
        fake.set_mode(Mode::Normal);
        let r = get(&fake, APPS_PATH).expect("answer").json();
        assert_eq!(r["applications"]["apps__hashcode"], "UP_1_");
    }

    #[test]
    fn wait_requests_times_out_naming_the_counts() {
        let fake = FakeEureka::start(&[]);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fake.wait_requests(1, Duration::from_millis(100))
        }));
        assert!(result.is_err(), "nothing fetched: the wait must time out");
    }
}
