//! `envoy/odmesh-remote-wasm.yaml`: the wasm filter fetched over HTTP (`code: {remote:
//! {http_uri, sha256, retry_policy}}`) instead of read from a file. It is `envoy/odmesh.yaml`
//! in every other line; Envoy fetches the module from a file server the test runs, and routes
//! with it; a module whose SHA-256 is not the configured one is refused. The wasm shell
//! always (this is the wasm filter's bootstrap): under `ODMESH_FILTER=native` it runs the
//! same. Needs `make envoy`, `make wasm` and `cargo build -p odmesh-control`.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use odmesh_e2e::{
    ControlPlane, EchoUpstream, Envoy, Instance, RegistryFile, Request, Shell, TestEnv,
    shipped_bootstrap, wait_until,
};

/// The module's source in the shipped file: a file server on 127.0.0.1:8000.
const SOURCE_PORT: &str = "port_value: 8000";
const SOURCE_URI: &str = "uri: http://127.0.0.1:8000/odmesh_filter.wasm";
const SHA256_PLACEHOLDER: &str = "REPLACE_WITH_THE_SHA256";
const RETRY_BACK_OFF: &str = "retry_back_off: {base_interval: 1s, max_interval: 10s}";
/// Retries after the first fetch, in the shipped file.
const RETRIES: usize = 5;

/// What the remote bootstrap has in place of each of odmesh.yaml's `code: {local: ...}`
/// (without its comments, as [`shipped_bootstrap`] reads it).
const REMOTE_CODE: &str = "                  code:
                    remote:
                      http_uri:
                        uri: http://127.0.0.1:8000/odmesh_filter.wasm
                        cluster: odmesh_wasm_source
                        timeout: 10s
                      sha256: \"REPLACE_WITH_THE_SHA256\"
                      retry_policy:
                        retry_back_off: {base_interval: 1s, max_interval: 10s}
                        num_retries: 5
";
const LOCAL_CODE: &str = "                  code: {local: {filename: dist/odmesh_filter.wasm}}\n";
/// The cluster the remote bootstrap adds.
const SOURCE_CLUSTER: &str = "  - name: odmesh_wasm_source
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: odmesh_wasm_source
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8000}}}
";
/// The xDS cluster's endpoint in the shipped bootstraps.
const XDS_ENDPOINT: &str = "address: 127.0.0.1, port_value: 18000}";

/// A file server for one file: answers every GET with `body`, and counts the requests.
struct FileServer {
    port: u16,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FileServer {
    fn start(body: Vec<u8>) -> FileServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let (requests, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (counted, stopped) = (requests.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                // The request line and headers, up to the empty line.
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let mut out = &stream;
                let _ = out
                    .write_all(head.as_bytes())
                    .and_then(|()| out.write_all(&body));
            }
        });
        FileServer {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The shipped module and its SHA-256 (`make wasm`'s `.sha256`).
fn shipped_module() -> (Vec<u8>, String) {
    let module = Shell::Wasm.artifact();
    let sum = std::fs::read_to_string(module.with_extension("wasm.sha256"))
        .expect("dist/odmesh_filter.wasm.sha256 (make wasm)");
    let sum = sum.split_whitespace().next().expect("a sum").to_owned();
    (std::fs::read(module).expect("the module"), sum)
}

/// The shipped remote bootstrap with free ports, the test's control plane and file server,
/// and `sha256`.
fn remote_bootstrap(xds_port: u16, source_port: u16, sha256: &str) -> String {
    shipped_bootstrap(
        "odmesh-remote-wasm.yaml",
        &[
            ("port_value: 15001", "port_value: 0", 1),
            ("port_value: 15006", "port_value: 0", 1),
            ("port_value: 9901", "port_value: 0", 1),
            (
                XDS_ENDPOINT,
                &XDS_ENDPOINT.replace("18000", &xds_port.to_string()),
                1,
            ),
            (SOURCE_PORT, &format!("port_value: {source_port}"), 1),
            (
                SOURCE_URI,
                &SOURCE_URI.replace("8000", &source_port.to_string()),
                2,
            ),
            (SHA256_PLACEHOLDER, sha256, 2),
            // Retries 10 times sooner than shipped: a refused module's retries end in ~1 s.
            (
                RETRY_BACK_OFF,
                "retry_back_off: {base_interval: 0.1s, max_interval: 1s}",
                2,
            ),
        ],
    )
}

#[test]
fn the_remote_bootstrap_is_the_shipped_one_with_the_module_fetched_over_http_and_validates() {
    let remote = shipped_bootstrap(
        "odmesh-remote-wasm.yaml",
        &[(REMOTE_CODE, LOCAL_CODE, 2), (SOURCE_CLUSTER, "", 1)],
    );
    assert_eq!(remote, shipped_bootstrap("odmesh.yaml", &[]));
    // Envoy accepts it as shipped (validate mode fetches nothing).
    let env = TestEnv::new("remote_wasm_validate");
    let (status, log) = Envoy::validate(
        &env,
        "validate",
        &shipped_bootstrap("odmesh-remote-wasm.yaml", &[]),
    );
    assert!(status.success(), "{log}");
}

/// A control plane on a registry of VIP `hello` and a policy that gives it a concurrency
/// limit (so the route switches the limit plugin on: README, "Adaptive concurrency"), and
/// Envoy from the remote bootstrap fetching the module from `files` with `sha256`.
fn start(env: &TestEnv, files: &FileServer, sha256: &str) -> (EchoUpstream, ControlPlane, Envoy) {
    let hello = EchoUpstream::start("hello-1");
    let registry = RegistryFile::create(
        &env.log_dir().join("registry.yaml"),
        &[Instance::new("hello", hello.port())],
    );
    let policy = env.write_file("policy.yaml", "vips: {hello: {concurrency_limit: {}}}\n");
    let policy = policy.to_string_lossy().into_owned();
    let control = ControlPlane::start(env, "control", registry.path(), &["--policy", &policy]);
    let bootstrap = remote_bootstrap(control.xds().port(), files.port, sha256);
    let envoy = Envoy::start(env, "envoy", &bootstrap);
    envoy.wait_xds_connected(true, Duration::from_secs(10));
    (hello, control, envoy)
}

#[test]
fn the_wasm_filter_fetched_over_http_routes_requests_and_limits_them() {
    let env = TestEnv::new("remote_wasm_routes");
    let (module, sha256) = shipped_module();
    let files = FileServer::start(module);
    let (_hello, _control, envoy) = start(&env, &files, &sha256);
    assert!(files.requests() >= 1, "Envoy did not fetch the module");
    let response = Request::get("/")
        .host("hello")
        .send(envoy.listener("odmesh_egress"));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["upstream"], "hello-1");
    // The wasm filter mapped the host.
    let stat = |name: &str| envoy.stat(&Shell::Wasm.counter(name));
    assert_eq!(stat("odmesh_requests_vip"), Some(1));
    // The limit plugin of the same module runs on the route too: it sets the VIP's gauge when
    // a window of its samples closes (10 answers and 100 ms: README, "Adaptive concurrency").
    wait_until(
        Duration::from_secs(10),
        "the limit plugin to set hello.vip's gauge",
        || {
            let response = Request::get("/")
                .host("hello")
                .send(envoy.listener("odmesh_egress"));
            assert_eq!(response.status, 200, "{}", response.text());
            stat("odmesh_concurrency_limit.cluster.hello.vip").is_some()
        },
    );
}

/// What Envoy 1.40 does with a module whose SHA-256 is not the configured one (docs/envoy.md,
/// "Loading the wasm over HTTP"): it fetches it again as the retry policy says, holding its
/// listeners meanwhile; then it starts without the filter, which fails closed: every request
/// gets a 503 and reaches no cluster.
#[test]
fn a_module_whose_sha256_differs_is_refused_and_requests_get_503() {
    let env = TestEnv::new("remote_wasm_wrong_sha256");
    let (module, sha256) = shipped_module();
    let files = FileServer::start(module);
    // The SHA-256 of nothing.
    let wrong = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert_ne!(sha256, wrong);
    let (hello, _control, envoy) = start(&env, &files, wrong);
    // Ready only once it gave up: each plugin fetched it 1 + RETRIES times.
    let log = envoy.log();
    assert!(
        log.contains("Retry limit exceeded for fetching data from remote data source")
            && log.contains("Plugin odmesh failed to load"),
        "{log}"
    );
    assert!(files.requests() > RETRIES, "{} fetches", files.requests());
    let response = Request::get("/")
        .host("hello")
        .send(envoy.listener("odmesh_egress"));
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(hello.requests(), 0);
    assert_eq!(
        envoy.stat(&Shell::Wasm.counter("odmesh_requests_vip")),
        None
    );
}
