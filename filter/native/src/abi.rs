//! Envoy 1.40's dynamic-module C ABI, bound by hand: the one module of the crate with
//! `unsafe` code.
//!
//! Written against `source/extensions/dynamic_modules/abi/abi.h` (ABI version `v0.2.0`, the
//! version Envoy 1.40.0 expects) and checked against the shipped binary: every callback named
//! here is in `nm -D --defined-only envoy`, every hook in its `strings` (docs/envoy.md, "The
//! dynamic-module ABI"). Buffers are `{ptr, length}` structs passed by value; C enums are `u32`.
//!
//! Above this module the filter sees only safe handles: [`Config`] while its configuration is
//! built (define counters, log) and [`Filter`] during a request (read and write request
//! headers, clear the route cache, answer locally, count). The hooks Envoy calls are exported
//! at the bottom: the five the filter uses call into [`crate::shell`]; Envoy insists that a
//! module export every other HTTP-filter hook it knows, so those are no-ops.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

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

/// A header the module owns (`envoy_dynamic_module_type_module_http_header`).
#[repr(C)]
struct ModuleHttpHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type_RequestHeader`.
const REQUEST_HEADERS: u32 = 0;
/// Log level `Critical` (`envoy_dynamic_module_type_log_level`).
const LOG_CRITICAL: u32 = 5;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: u32 = 0;

unsafe extern "C" {
    fn envoy_dynamic_module_callback_http_get_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: *mut c_void);
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
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
}

/// A counter Envoy defined for the filter configuration.
#[derive(Clone, Copy, Debug)]
pub struct CounterId(usize);

/// The filter configuration being built, inside `config_new` (the only place Envoy lets a
/// module define counters).
pub struct Config {
    envoy: *mut c_void,
}

impl Config {
    /// Defines the counter `name` (`dynamicmodulescustom.<name>` in Envoy's stats); `None` if
    /// Envoy refused it.
    pub fn define_counter(&self, name: &str) -> Option<CounterId> {
        let mut id = 0usize;
        // SAFETY: `self.envoy` is the config pointer Envoy passed to `config_new`, valid for
        // the duration of that call, which is the only place a `Config` exists; the name buffer
        // outlives the call; no labels (null, 0); `id` is a valid place for Envoy's answer.
        let result = unsafe {
            envoy_dynamic_module_callback_http_filter_config_define_counter(
                self.envoy,
                ModuleBuffer::of(name.as_bytes()),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (result == METRICS_SUCCESS).then_some(CounterId(id))
    }
}

/// Writes `message` to Envoy's log at level critical.
pub fn log_critical(message: &str) {
    // SAFETY: the buffer points at `message`, which outlives the call; Envoy copies it.
    unsafe { envoy_dynamic_module_callback_log(LOG_CRITICAL, ModuleBuffer::of(message.as_bytes())) }
}

/// One request, inside a hook Envoy called for it.
pub struct Filter {
    envoy: *mut c_void,
}

impl Filter {
    /// The first value of request header `name`, copied; `None` if the request has none.
    pub fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        let mut value = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: `self.envoy` is the filter pointer of the hook running now (valid until
        // `on_http_filter_destroy`); the key buffer outlives the call; `value` is a valid
        // place for the answer; index 0 and no size wanted (null).
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.envoy,
                REQUEST_HEADERS,
                ModuleBuffer::of(name.as_bytes()),
                &mut value,
                0,
                std::ptr::null_mut(),
            )
        };
        if !found || value.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy answered `true` with a buffer into the header map, valid until a setter
        // is called or the hook returns; it is copied at once, before either happens.
        let bytes = unsafe { std::slice::from_raw_parts(value.ptr.cast::<u8>(), value.length) };
        Some(bytes.to_vec())
    }

    /// Sets request header `name` to `value`, replacing every value it had.
    pub fn set_request_header(&self, name: &str, value: &str) {
        // SAFETY: the filter pointer of the running hook; both buffers outlive the call and
        // Envoy copies them. A non-empty value sets (an empty one would remove).
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                REQUEST_HEADERS,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            );
        }
    }

    /// Removes request header `name`.
    pub fn remove_request_header(&self, name: &str) {
        // SAFETY: as `set_request_header`; an empty value (null, 0) removes the header.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                REQUEST_HEADERS,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer {
                    ptr: std::ptr::null(),
                    length: 0,
                },
            );
        }
    }

    /// Makes Envoy pick the route (and the `cluster_header` cluster) again: a native filter
    /// must say so after changing the header, which Envoy's wasm host does by itself.
    pub fn clear_route_cache(&self) {
        // SAFETY: the filter pointer of the running hook.
        unsafe { envoy_dynamic_module_callback_http_clear_route_cache(self.envoy) }
    }

    /// Answers the request locally: `status`, the headers, `body`, and `details` (Envoy's
    /// response code details: no spaces).
    pub fn send_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let mut headers: Vec<ModuleHttpHeader> = (headers.iter())
            .map(|(name, value)| ModuleHttpHeader {
                key_ptr: name.as_ptr().cast(),
                key_length: name.len(),
                value_ptr: value.as_ptr().cast(),
                value_length: value.len(),
            })
            .collect();
        // SAFETY: the filter pointer of the running hook; the header array, its strings, the
        // body and the details outlive the call, and Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.envoy,
                status,
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            );
        }
    }

    /// Adds one to counter `id`.
    pub fn increment(&self, id: CounterId) {
        // SAFETY: the filter pointer of the running hook; `id` came from Envoy for this
        // filter's configuration; no labels (null, 0), as it was defined.
        unsafe {
            envoy_dynamic_module_callback_http_filter_increment_counter(
                self.envoy,
                id.0,
                std::ptr::null_mut(),
                0,
                1,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The hooks Envoy calls. A panic must not unwind into Envoy: each hook that runs filter code
// catches it (and the request gets a 500).

/// `FilterHeadersStatus::Continue`.
const CONTINUE: u32 = 0;
/// `FilterHeadersStatus::StopIteration`.
const STOP_ITERATION: u32 = 1;

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
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: both buffers are the ones Envoy passed to this call.
    let (name, config) = unsafe { (bytes_of(name), bytes_of(config)) };
    let handle = Config {
        envoy: config_envoy,
    };
    let built = catch_unwind(AssertUnwindSafe(|| {
        crate::shell::config_new(&handle, &name, &config)
    }));
    match built {
        Ok(Some(plugin)) => Box::into_raw(Box::new(plugin)).cast_const().cast(),
        // Null: Envoy refuses the filter configuration (the shell logged why).
        Ok(None) | Err(_) => std::ptr::null(),
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: a non-null config pointer is one `config_new` made with `Box::into_raw`, and
        // Envoy destroys it once, after every filter of it is gone.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<crate::shell::Plugin>()) });
    }
}

/// A request needs no state of its own, so its module pointer is its configuration's:
/// nothing is allocated per request, and `on_http_filter_destroy` frees nothing. Envoy keeps
/// the configuration alive while any of its filters lives.
#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: *mut c_void,
) -> *const c_void {
    config
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: *mut c_void,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: `module` is what `filter_new` returned: the `Plugin` that `config_new` boxed,
    // alive while this filter is (see `filter_new`), and only read.
    let plugin = unsafe { &*module.cast::<crate::shell::Plugin>() };
    let filter = Filter {
        envoy: filter_envoy,
    };
    let handled = catch_unwind(AssertUnwindSafe(|| {
        crate::shell::on_request_headers(&filter, plugin)
    }));
    match handled {
        Ok(true) => CONTINUE,
        Ok(false) => STOP_ITERATION,
        Err(_) => {
            let body = b"odmesh: the filter failed on this request\n";
            filter.send_response(500, &[], body, "odmesh_filter_panic");
            STOP_ITERATION
        }
    }
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_module: *const c_void) {}

// The hooks the filter does not use; Envoy refuses a module without them.

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    // Null: odmesh has no per-route configuration, and Envoy refuses one.
    std::ptr::null()
}

#[unsafe(no_mangle)]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_: *const c_void) {}

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
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _: *mut c_void,
    _: *const c_void,
    _: bool,
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
