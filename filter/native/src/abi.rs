//! Envoy 1.40's dynamic-module C ABI for a route-time cluster specifier
//! (`envoy.router.cluster_specifier_plugin.dynamic_modules`) and for the concurrency limit's
//! HTTP filter (`envoy.filters.http.dynamic_modules`), bound by hand: the one module of the
//! crate with `unsafe` code.
//!
//! Written against Envoy's `abi.h` (ABI version `v0.2.0`, the version Envoy 1.40.0 expects) and
//! checked against the shipped binary: the test `filter_shells.rs`
//! `every_callback_the_native_module_imports_is_one_envoy_exports` finds each callback below in
//! `nm -D --defined-only envoy`, and `every_hook_the_native_module_exports_is_one_envoy_looks_up`
//! finds each hook in its strings (docs/envoy.md, "The dynamic-module ABI"). Buffers are
//! `{ptr, length}` structs passed by value; C enums are `u32`.
//!
//! Above this module the shell sees only safe handles: [`SpecifierConfig`] while its
//! configuration is built (define counters), [`Counters`] to count from any worker, and
//! [`Selection`] while one request's route resolves (read request headers, set the cluster,
//! the not-found status and route metadata). The three hooks Envoy looks up for a cluster
//! specifier are at the bottom, with `on_program_init`; after them the HTTP filter's hooks,
//! which run [`crate::limit`] (Envoy insists that a module with an HTTP filter export every
//! HTTP-filter hook it knows, so those the limit does not need are no-ops).

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use std::sync::Arc;

use crate::limit;
use crate::shell::{self, CounterId, Plugin};

/// The ABI version this module is written for; Envoy logs "matched" for it, and a warning
/// ("deprecated") for any other.
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// A buffer Envoy owns (`envoy_dynamic_module_type_envoy_buffer`).
#[repr(C)]
#[derive(Clone, Copy)]
struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

/// A buffer the module owns (`envoy_dynamic_module_type_module_buffer`).
#[repr(C)]
#[derive(Clone, Copy)]
struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }
}

/// A header Envoy owns (`envoy_dynamic_module_type_envoy_http_header`).
#[repr(C)]
#[derive(Clone, Copy)]
struct EnvoyHttpHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

/// A header the module owns (`envoy_dynamic_module_type_module_http_header`).
#[repr(C)]
struct ModuleHttpHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type_RequestHeader`.
const REQUEST_HEADER: u32 = 0;

/// `envoy_dynamic_module_type_on_http_filter_request_headers_status_Continue` (and the
/// `Continue` of every other status enum of the HTTP filter).
const CONTINUE: u32 = 0;
/// `..._request_headers_status_StopIteration`.
const STOP_ITERATION: u32 = 1;

/// Log level `Critical` (`envoy_dynamic_module_type_log_level`).
const LOG_CRITICAL: u32 = 5;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: u32 = 0;
/// The route metadata namespace the module writes (read by the bootstrap's local replies as
/// `%METADATA(ROUTE:odmesh:<key>)%`).
const METADATA_NAMESPACE: &[u8] = b"odmesh";

unsafe extern "C" {
    fn envoy_dynamic_module_callback_cluster_specifier_get_request_headers_size(
        context: *mut c_void,
    ) -> usize;
    fn envoy_dynamic_module_callback_cluster_specifier_get_request_headers(
        context: *mut c_void,
        result: *mut EnvoyHttpHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_cluster_specifier_set_cluster_name(
        context: *mut c_void,
        cluster_name: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_cluster_specifier_set_cluster_not_found_response_code(
        context: *mut c_void,
        status_code: u32,
    ) -> bool;
    fn envoy_dynamic_module_callback_cluster_specifier_set_timeout(
        context: *mut c_void,
        timeout_ms: u64,
    );
    fn envoy_dynamic_module_callback_cluster_specifier_set_route_action_override(
        context: *mut c_void,
        name: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_cluster_specifier_set_route_metadata_string(
        context: *mut c_void,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        value: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_cluster_specifier_get_cluster_host_count(
        context: *mut c_void,
        cluster_name: ModuleBuffer,
        priority: u32,
        total: *mut usize,
        healthy: *mut usize,
        degraded: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_cluster_specifier_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_cluster_specifier_config_increment_counter(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);

    fn envoy_dynamic_module_callback_http_get_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_get_most_specific_route_config(
        filter: *mut c_void,
    ) -> *const c_void;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: *mut c_void,
        status_code: u32,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        gauge_id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_set_gauge(
        filter: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
}

/// The specifier configuration being built, inside `config_new` (the only place Envoy lets a
/// module define counters).
pub struct SpecifierConfig {
    envoy: *mut c_void,
}

impl shell::Setup for SpecifierConfig {
    fn define_counter(&self, name: &str) -> Option<CounterId> {
        let mut id = 0usize;
        // SAFETY: `self.envoy` is the config pointer Envoy passed to `config_new`, valid for
        // the duration of that call, which is the only place a `SpecifierConfig` exists; the
        // name buffer outlives the call; no labels (null, 0); `id` is a valid place for the
        // answer.
        let result = unsafe {
            envoy_dynamic_module_callback_cluster_specifier_config_define_counter(
                self.envoy,
                ModuleBuffer::of(name.as_bytes()),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (result == METRICS_SUCCESS).then_some(CounterId(id))
    }

    fn log_critical(&self, message: &str) {
        // SAFETY: the buffer points at `message`, which outlives the call; Envoy copies it.
        unsafe {
            envoy_dynamic_module_callback_log(LOG_CRITICAL, ModuleBuffer::of(message.as_bytes()))
        }
    }
}

/// Envoy's side of one specifier configuration, kept to count from `select` on any worker.
#[derive(Debug)]
pub struct Counters {
    envoy: *mut c_void,
}

// SAFETY: the pointer is Envoy's configuration object, which lives until Envoy calls
// `config_destroy` for the module configuration that holds this handle (so never after it), and
// Envoy's counter increments are atomic: any worker may call them at any time.
unsafe impl Send for Counters {}
// SAFETY: as for `Send`; the handle is only read.
unsafe impl Sync for Counters {}

impl Counters {
    fn increment(&self, id: CounterId) {
        // SAFETY: the configuration pointer (see the `Send` impl); `id` came from Envoy for
        // this configuration; no labels (null, 0), as it was defined.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_config_increment_counter(
                self.envoy,
                id.0,
                std::ptr::null_mut(),
                0,
                1,
            );
        }
    }
}

/// One request whose route is resolving, inside `select`.
pub struct Selection<'a> {
    envoy: *mut c_void,
    counters: &'a Counters,
    /// The request's headers, read from Envoy at the first look: one call for all of them
    /// costs less than one lookup by name per header the mapping reads (docs/benchmarks.md,
    /// "6. Request chains").
    headers: std::cell::OnceCell<Vec<EnvoyHttpHeader>>,
}

impl Selection<'_> {
    fn all_headers(&self) -> &[EnvoyHttpHeader] {
        self.headers.get_or_init(|| {
            // SAFETY: `self.envoy` is the context of the running `select`.
            let count = unsafe {
                envoy_dynamic_module_callback_cluster_specifier_get_request_headers_size(self.envoy)
            };
            let mut headers = Vec::with_capacity(count);
            // SAFETY: the context of the running `select`; `headers` has room for the `count`
            // entries Envoy writes (the header map cannot change during `select`).
            let filled = unsafe {
                envoy_dynamic_module_callback_cluster_specifier_get_request_headers(
                    self.envoy,
                    headers.as_mut_ptr(),
                )
            };
            if filled {
                // SAFETY: Envoy wrote `count` entries.
                unsafe { headers.set_len(count) };
            }
            headers
        })
    }
}

/// The bytes of a buffer in Envoy's header map.
///
/// # Safety
/// `ptr` and `length` must describe a header key or value Envoy handed to the running
/// `select`: the header map outlives the call and cannot change during it.
unsafe fn header_bytes<'a>(ptr: *const c_char, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), length) }
}

impl shell::Request for Selection<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        (self.all_headers().iter()).find_map(|h| {
            // SAFETY: an entry Envoy wrote during this `select` (see `all_headers`).
            let key = unsafe { header_bytes(h.key_ptr, h.key_length) };
            key.eq_ignore_ascii_case(name.as_bytes()).then(|| {
                // SAFETY: as the key; copied at once.
                unsafe { header_bytes(h.value_ptr, h.value_length) }.to_vec()
            })
        })
    }

    fn route_to(&mut self, cluster: &str) {
        // SAFETY: the context of the running `select`; Envoy copies the name.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_set_cluster_name(
                self.envoy,
                ModuleBuffer::of(cluster.as_bytes()),
            )
        }
    }

    fn has_cluster(&self, cluster: &str) -> bool {
        let (mut total, mut healthy, mut degraded) = (0usize, 0usize, 0usize);
        // SAFETY: the context of the running `select`; the name outlives the call; the three
        // counts are valid places for Envoy's answers. Priority 0 exists in every cluster.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_get_cluster_host_count(
                self.envoy,
                ModuleBuffer::of(cluster.as_bytes()),
                0,
                &mut total,
                &mut healthy,
                &mut degraded,
            )
        }
    }

    fn note(&mut self, key: &str, value: &str) {
        // SAFETY: the context of the running `select`; the three buffers outlive the call and
        // Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_set_route_metadata_string(
                self.envoy,
                ModuleBuffer::of(METADATA_NAMESPACE),
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    fn not_found_status(&mut self, status: u32) -> bool {
        // SAFETY: the context of the running `select`.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_set_cluster_not_found_response_code(
                self.envoy, status,
            )
        }
    }

    fn set_timeout_ms(&mut self, ms: u64) {
        // SAFETY: the context of the running `select`.
        unsafe { envoy_dynamic_module_callback_cluster_specifier_set_timeout(self.envoy, ms) }
    }

    fn use_override(&mut self, name: &str) -> bool {
        // SAFETY: the context of the running `select`; Envoy looks the name up during the call.
        unsafe {
            envoy_dynamic_module_callback_cluster_specifier_set_route_action_override(
                self.envoy,
                ModuleBuffer::of(name.as_bytes()),
            )
        }
    }

    fn count(&mut self, id: CounterId) {
        self.counters.increment(id);
    }
}

// ---------------------------------------------------------------------------------------------
// The hooks Envoy calls. A panic must not unwind into Envoy: each hook that runs shell code
// catches it.

/// One module configuration: the shell's plugin and Envoy's handle to count with.
struct Loaded {
    plugin: Plugin,
    counters: Counters,
}

/// Copies an Envoy buffer, valid for the running hook only.
///
/// # Safety
/// `buffer` must be a buffer Envoy passed to the running hook.
unsafe fn bytes_of(buffer: EnvoyBuffer) -> Vec<u8> {
    if buffer.ptr.is_null() || buffer.length == 0 {
        return Vec::new();
    }
    // SAFETY: per this function's contract, Envoy's buffer is valid during the hook.
    unsafe { std::slice::from_raw_parts(buffer.ptr.cast::<u8>(), buffer.length) }.to_vec()
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_cluster_specifier_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: both buffers are the ones Envoy passed to this call.
    let (name, config) = unsafe { (bytes_of(name), bytes_of(config)) };
    let setup = SpecifierConfig {
        envoy: config_envoy,
    };
    let built = catch_unwind(AssertUnwindSafe(|| {
        shell::config_new(&setup, &name, &config)
    }));
    match built {
        Ok(Some(plugin)) => {
            let counters = Counters {
                envoy: config_envoy,
            };
            let loaded = Loaded { plugin, counters };
            Box::into_raw(Box::new(loaded)).cast_const().cast()
        }
        // Null: Envoy refuses the configuration (the shell logged why).
        Ok(None) | Err(_) => std::ptr::null(),
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_cluster_specifier_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: a non-null config pointer is one `config_new` made with `Box::into_raw`, and
        // Envoy destroys it once, after every route using it is gone.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<Loaded>()) });
    }
}

/// Runs while Envoy resolves the route of one request: `true` applies what the shell set.
/// Nothing is allocated for the request beyond the header copies the mapping reads.
#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_cluster_specifier_select(
    config: *const c_void,
    context: *mut c_void,
) -> bool {
    // SAFETY: `config` is what `config_new` returned (never null: Envoy refuses a null one),
    // alive while any route using it is, and only read.
    let loaded = unsafe { &*config.cast::<Loaded>() };
    let mut selection = Selection {
        envoy: context,
        counters: &loaded.counters,
        headers: std::cell::OnceCell::new(),
    };
    let chosen = catch_unwind(AssertUnwindSafe(|| {
        shell::select(&loaded.plugin, &mut selection)
    }));
    chosen.unwrap_or_else(|_| shell::failed(&mut selection))
}

// ---------------------------------------------------------------------------------------------
// The concurrency limit's HTTP filter (crate::limit).

/// The filter configuration: the refusal counter and the limit's gauge, if Envoy defined them.
struct LimitConfig {
    limited: Option<CounterId>,
    limit: Option<CounterId>,
}

/// One request under the filter: its configuration and what the limit holds for it.
struct LimitFilter {
    config: *const LimitConfig,
    attempt: limit::Attempt,
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: the buffer Envoy passed to this call.
    let name = unsafe { bytes_of(name) };
    if name != limit::FILTER_NAME.as_bytes() {
        let message = format!(
            "odmesh: the native module has one HTTP filter, {:?}, not {:?}",
            limit::FILTER_NAME,
            String::from_utf8_lossy(&name)
        );
        log_critical(&message);
        return std::ptr::null();
    }
    let mut id = 0usize;
    let metric = limit::METRIC_LIMITED.as_bytes();
    // SAFETY: the config pointer Envoy passed to this call, valid during it; the name buffer
    // outlives the call; no labels (null, 0); `id` is a valid place for the answer.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_config_define_counter(
            config_envoy,
            ModuleBuffer::of(metric),
            std::ptr::null_mut(),
            0,
            &mut id,
        )
    };
    let limited = (result == METRICS_SUCCESS).then_some(CounterId(id));
    let mut label = [ModuleBuffer::of(limit::METRIC_LABEL.as_bytes())];
    // SAFETY: as above; the label array and its string outlive the call.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_config_define_gauge(
            config_envoy,
            ModuleBuffer::of(limit::METRIC_LIMIT.as_bytes()),
            label.as_mut_ptr(),
            label.len(),
            &mut id,
        )
    };
    let limit = (result == METRICS_SUCCESS).then_some(CounterId(id));
    Box::into_raw(Box::new(LimitConfig { limited, limit }))
        .cast_const()
        .cast()
}

fn log_critical(message: &str) {
    // SAFETY: the buffer points at `message`, which outlives the call; Envoy copies it.
    unsafe { envoy_dynamic_module_callback_log(LOG_CRITICAL, ModuleBuffer::of(message.as_bytes())) }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: a non-null config pointer is one `config_new` made with `Box::into_raw`, and
        // Envoy destroys it once, after every filter of it is gone.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<LimitConfig>()) });
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: the buffer Envoy passed to this call.
    let config = unsafe { bytes_of(config) };
    let made = catch_unwind(|| limit::route_config_new(&config, limit::now()));
    match made {
        Ok(Ok(destination)) => Box::into_raw(Box::new(destination)).cast_const().cast(),
        Ok(Err(e)) => {
            log_critical(&e);
            std::ptr::null()
        }
        Err(_) => std::ptr::null(),
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: a non-null per-route pointer is one `per_route_config_new` made with
        // `Box::into_raw`, destroyed once by Envoy with its route.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<Arc<limit::Destination>>()) });
    }
}

/// Envoy creates the filter only for the requests whose route switches it on.
#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: *mut c_void,
) -> *const c_void {
    let filter = LimitFilter {
        config: config.cast(),
        attempt: limit::Attempt::default(),
    };
    Box::into_raw(Box::new(filter)).cast_const().cast()
}

/// The filter of the running hook.
///
/// # Safety
/// `module` must be what `filter_new` returned, not yet destroyed, and used by this hook alone
/// (Envoy runs one stream's hooks on one thread, one at a time).
unsafe fn filter_of<'a>(module: *const c_void) -> &'a mut LimitFilter {
    // SAFETY: per this function's contract.
    unsafe { &mut *module.cast_mut().cast::<LimitFilter>() }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: *mut c_void,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: the module pointer of this stream, in one of its hooks.
    let filter = unsafe { filter_of(module) };
    // SAFETY: the filter pointer of the running hook. What Envoy answers is null or a pointer
    // `per_route_config_new` returned, kept alive by the route, which the stream holds.
    let route = unsafe {
        envoy_dynamic_module_callback_get_most_specific_route_config(filter_envoy)
            .cast::<Arc<limit::Destination>>()
            .as_ref()
    };
    let started = catch_unwind(AssertUnwindSafe(|| {
        filter.attempt.start(route, limit::now())
    }));
    let Ok(Err(refusal)) = started else {
        // Let in, or the limiter failed: a limit must never cost a request that would work.
        return CONTINUE;
    };
    let mut content_type = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    // SAFETY: the filter pointer of the running hook; the key outlives the call; Envoy writes
    // a buffer into its header map (valid during this hook) into `content_type`, and nothing
    // into the optional size (null).
    let found = unsafe {
        envoy_dynamic_module_callback_http_get_header(
            filter_envoy,
            REQUEST_HEADER,
            ModuleBuffer::of(b"content-type"),
            &mut content_type,
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a buffer Envoy handed to this hook (or nothing).
    let content_type = (found && !content_type.ptr.is_null()).then(|| unsafe {
        std::slice::from_raw_parts(content_type.ptr.cast::<u8>(), content_type.length)
    });
    let mut headers: Vec<ModuleHttpHeader> = (refusal.headers(limit::is_grpc(content_type)))
        .into_iter()
        .map(|(key, value)| ModuleHttpHeader {
            key_ptr: key.as_ptr().cast(),
            key_length: key.len(),
            value_ptr: value.as_ptr().cast(),
            value_length: value.len(),
        })
        .collect();
    // SAFETY: the filter pointer of the running hook; the header array, its strings, the
    // body and the details outlive the call, and Envoy copies them.
    unsafe {
        envoy_dynamic_module_callback_http_send_response(
            filter_envoy,
            limit::STATUS,
            headers.as_mut_ptr(),
            headers.len(),
            ModuleBuffer::of(refusal.body.as_bytes()),
            ModuleBuffer::of(limit::DETAILS.as_bytes()),
        )
    };
    // SAFETY: `config` is the configuration this filter was made under, which Envoy keeps
    // while any of its filters lives.
    if let Some(id) = unsafe { &*filter.config }.limited {
        // SAFETY: the filter pointer of the running hook; `id` was defined for its
        // configuration, without labels.
        unsafe {
            envoy_dynamic_module_callback_http_filter_increment_counter(
                filter_envoy,
                id.0,
                std::ptr::null_mut(),
                0,
                1,
            )
        };
    }
    STOP_ITERATION
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: *mut c_void,
    module: *const c_void,
    _: bool,
) -> u32 {
    // SAFETY: the module pointer of this stream, in one of its hooks.
    let filter = unsafe { filter_of(module) };
    // SAFETY: the configuration this filter was made under, alive while the filter is.
    let gauge = unsafe { &*filter.config }.limit;
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let (Some((cluster, limit)), Some(id)) = (filter.attempt.responded(limit::now()), gauge)
        {
            let mut label = [ModuleBuffer::of(cluster.as_bytes())];
            // SAFETY: the filter pointer of the running hook; `id` was defined for its
            // configuration with one label, given here; Envoy copies the label value.
            unsafe {
                envoy_dynamic_module_callback_http_filter_set_gauge(
                    filter_envoy,
                    id.0,
                    label.as_mut_ptr(),
                    label.len(),
                    u64::from(limit),
                )
            };
        }
    }));
    CONTINUE
}

/// The stream is over, however it ended: the slot is freed, then the filter.
#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    // SAFETY: the module pointer `filter_new` made with `Box::into_raw`, destroyed once.
    let mut filter = unsafe { Box::from_raw(module.cast_mut().cast::<LimitFilter>()) };
    let _ = catch_unwind(AssertUnwindSafe(|| filter.attempt.end(limit::now())));
}

// The HTTP-filter hooks the limit does not use; Envoy refuses a module without them.

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _: *mut c_void,
    _: *const c_void,
    _: bool,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _: *mut c_void,
    _: *const c_void,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _: *mut c_void,
    _: *const c_void,
    _: bool,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _: *mut c_void,
    _: *const c_void,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _: *mut c_void,
    _: *const c_void,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _: *mut c_void,
    _: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    CONTINUE
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _: *mut c_void,
    _: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut c_void,
    _headers_size: usize,
    _body_chunks: *mut c_void,
    _body_chunks_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _headers: *mut c_void,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _data: *const c_void,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _trailers: *mut c_void,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _: *mut c_void,
    _: *const c_void,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _: *mut c_void,
    _: *const c_void,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _: *mut c_void,
    _: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut c_void,
    _headers_size: usize,
    _body_chunks: *mut c_void,
    _body_chunks_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _headers: *mut c_void,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _data: *const c_void,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _trailers: *mut c_void,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _: *mut c_void,
    _: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _: *mut c_void,
    _: *const c_void,
) {
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _: *mut c_void,
    _: *const c_void,
) {
}
