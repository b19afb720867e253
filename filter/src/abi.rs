//! The proxy-wasm ABI 0.2.1, spoken directly: the host functions the filter calls, the
//! functions it exports, and who owns which memory. The only module with `unsafe` code; the
//! rest of the crate sees safe functions.
//!
//! **Exports.** Envoy's proxy-wasm host (proxy-wasm-cpp-host) looks each callback up by name
//! when it loads the module, and for a callback the module does not export it skips the call
//! into the VM. Such calls cost Envoy CPU on every request (docs/benchmarks.md, section 2,
//! measures how much), so the filter exports only what it needs:
//!
//! | export | why |
//! |---|---|
//! | `proxy_abi_version_0_2_1` | the host reads the ABI version from this name; without it, it refuses the module |
//! | `proxy_on_memory_allocate` | required: the host allocates in the VM through it, e.g. to hand over a header value |
//! | `_initialize` | the WASI reactor entry, called once per VM: runs the static constructors, sets the panic hook |
//! | `proxy_on_context_create` | names the root context (plugin) of each new HTTP context ([`crate::contexts`]) |
//! | `proxy_on_configure` | reads and checks the plugin configuration; `false` refuses it |
//! | `proxy_on_request_headers` | the filter's work |
//!
//! Everything else the host treats as absent: no `proxy_on_vm_start` (a missing one counts as
//! success), and no `proxy_on_response_headers`, `_body`, `_trailers`, `proxy_on_request_body`,
//! `_trailers`, `proxy_on_log`, `proxy_on_done` or `proxy_on_delete`, which an SDK exports and
//! the host then calls for every request.
//!
//! **Memory.** A buffer the host returns (a header value, the plugin configuration) is
//! allocated in the VM by the host calling `proxy_on_memory_allocate`, which allocates exactly
//! the size asked for with the global allocator; the host writes it and hands its address and
//! size back through out-parameters. From then on the filter owns it, as a `Vec<u8>`
//! ([`take_buffer`]). What the filter passes to the host (names, values, bodies) stays the
//! filter's: the host copies it during the call.

use std::alloc::{Layout, alloc};
use std::ptr::{self, NonNull};

use crate::glue;

/// What the filter asks of the host after a callback, as `proxy_on_request_headers` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Go on with the next filter.
    Continue = 0,
    /// Stop here (the filter has sent a local reply).
    Pause = 1,
}

/// Log levels of `proxy_log` (only those the filter uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Envoy logs it at `critical`.
    Critical = 5,
}

/// `proxy_status_t`: what every host function returns.
const STATUS_OK: u32 = 0;
const STATUS_NOT_FOUND: u32 = 1;
/// `proxy_map_type_t` of the request headers.
const MAP_REQUEST_HEADERS: u32 = 0;
/// `proxy_buffer_type_t` of the plugin configuration.
const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;
/// `proxy_metric_type_t` of a counter.
const METRIC_COUNTER: u32 = 0;
/// The gRPC status of a local reply that is not a gRPC answer.
const GRPC_STATUS_NONE: i32 = -1;

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
}

// The linker defines this: it runs the static constructors of everything linked in (wasi-libc's,
// if any).
#[cfg(target_os = "wasi")]
unsafe extern "C" {
    fn __wasm_call_ctors();
}

// ---------------------------------------------------------------------------------------------
// Exports

/// Marks the module as speaking the proxy-wasm ABI 0.2.1; never called.
#[unsafe(no_mangle)]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The WASI reactor entry: the host calls it once, before any other export.
#[unsafe(no_mangle)]
pub extern "C" fn _initialize() {
    // SAFETY: `__wasm_call_ctors` is the linker's function that runs the static constructors;
    // the host calls `_initialize` once per VM, before anything else, as constructors expect.
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors();
    }
    glue::on_initialize();
}

/// Allocates `size` bytes for the host to write into; the filter takes them over with
/// [`take_buffer`]. Null if the allocation fails (the host then fails its call).
#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size == 0 {
        // The global allocator cannot allocate zero bytes; a dangling pointer stands for an
        // empty buffer, which `Vec::from_raw_parts` accepts with capacity 0.
        return NonNull::dangling().as_ptr();
    }
    match Layout::array::<u8>(size) {
        // SAFETY: the layout's size is not zero.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => ptr::null_mut(),
    }
}

/// A new context: an HTTP context of root context `root_context_id`, or a root context when
/// that is 0.
#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_context_create(context_id: u32, root_context_id: u32) {
    glue::on_context_create(context_id, root_context_id);
}

/// Root context `root_context_id` is configured: 1 accepts the plugin configuration, 0
/// refuses it.
#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_configure(root_context_id: u32, _configuration_size: usize) -> u32 {
    u32::from(glue::on_configure(root_context_id))
}

/// The request headers of HTTP context `context_id` have arrived.
#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_request_headers(
    context_id: u32,
    _num_headers: usize,
    _end_of_stream: u32,
) -> u32 {
    glue::on_request_headers(context_id) as u32
}

// ---------------------------------------------------------------------------------------------
// Host calls, safe

/// Takes over a buffer the host returned.
///
/// # Safety
/// `data` is null, or the host got it from [`proxy_on_memory_allocate`]`(size)` and wrote
/// `size` bytes to it, and nothing else owns it.
unsafe fn take_buffer(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: by the caller's contract, `data` holds `size` initialised bytes allocated by the
    // global allocator with `Layout::array::<u8>(size)` (or is dangling with `size` 0), which
    // is what `Vec::from_raw_parts(data, size, size)` requires; the Vec now owns it.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// Logs `message` in Envoy's log at `level`.
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: the host reads `message.len()` bytes at `message.as_ptr()` during the call.
    // A failed log has nowhere to be reported, so its status is ignored.
    let _ = unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
}

/// The plugin configuration (empty if there is none), or the host's status if it could not
/// return it.
pub fn plugin_configuration() -> Result<Vec<u8>, u32> {
    let mut data: *mut u8 = ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the out-parameters point to live locals, which the host sets to a buffer it
    // allocated with `proxy_on_memory_allocate` (or leaves null).
    let status = unsafe {
        proxy_get_buffer_bytes(
            BUFFER_PLUGIN_CONFIGURATION,
            0,
            usize::MAX,
            &mut data,
            &mut size,
        )
    };
    match status {
        // SAFETY: on success the host handed over `data` as `take_buffer` requires.
        STATUS_OK => Ok(unsafe { take_buffer(data, size) }),
        STATUS_NOT_FOUND => Ok(Vec::new()),
        status => Err(status),
    }
}

/// The value of request header `name`: `None` if the request has none (or the host fails),
/// empty if its value is empty.
pub fn request_header(name: &str) -> Option<Vec<u8>> {
    let mut data: *mut u8 = ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the host reads `name` during the call; the out-parameters point to live locals,
    // which the host sets to a buffer it allocated with `proxy_on_memory_allocate` (or null
    // for an empty value).
    let status = unsafe {
        proxy_get_header_map_value(
            MAP_REQUEST_HEADERS,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        )
    };
    // SAFETY: on success the host handed over `data` as `take_buffer` requires.
    (status == STATUS_OK).then(|| unsafe { take_buffer(data, size) })
}

/// Sets request header `name` to `value`, replacing any value it had.
pub fn set_request_header(name: &str, value: &str) {
    // SAFETY: the host reads both strings during the call. A failure (the host has no request
    // headers at this point) leaves nothing the filter could do, so its status is ignored.
    let _ = unsafe {
        proxy_replace_header_map_value(
            MAP_REQUEST_HEADERS,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
}

/// Removes request header `name`.
pub fn remove_request_header(name: &str) {
    // SAFETY: the host reads `name` during the call; a failure is ignored as in
    // `set_request_header`.
    let _ =
        unsafe { proxy_remove_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len()) };
}

/// Answers the request itself with `status`, `headers` and `body`; it goes no further.
pub fn send_local_response(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    let headers = serialize_pairs(headers);
    // SAFETY: the host reads the body and the serialized headers during the call (the details
    // are empty: a null pointer with size 0 is an empty string to the host). A failure leaves
    // the request paused with no answer to send, so its status is ignored.
    let _ = unsafe {
        proxy_send_local_response(
            status,
            ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            GRPC_STATUS_NONE,
        )
    };
}

/// Defines the counter `name` (Envoy's stat `wasmcustom.<name>`); its id, or `None` if the
/// host refused.
pub fn define_counter(name: &str) -> Option<u32> {
    let mut id: u32 = 0;
    // SAFETY: the host reads `name` and writes the id to a live local during the call.
    let status = unsafe { proxy_define_metric(METRIC_COUNTER, name.as_ptr(), name.len(), &mut id) };
    (status == STATUS_OK).then_some(id)
}

/// Adds 1 to counter `id`. A failed increment only loses a count.
pub fn increment_counter(id: u32) {
    // SAFETY: plain values; the host reads no memory.
    let _ = unsafe { proxy_increment_metric(id, 1) };
}

/// Header pairs as the host reads them: the number of pairs, then each name's and value's
/// length (all `u32` little-endian), then each name and value followed by a NUL byte.
fn serialize_pairs(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len() + 2)
        .sum::<usize>();
    let mut bytes = Vec::with_capacity(size);
    let len = |s: usize| u32::try_from(s).unwrap_or(u32::MAX).to_le_bytes();
    bytes.extend_from_slice(&len(pairs.len()));
    for (name, value) in pairs {
        bytes.extend_from_slice(&len(name.len()));
        bytes.extend_from_slice(&len(value.len()));
    }
    for (name, value) in pairs {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    bytes
}
