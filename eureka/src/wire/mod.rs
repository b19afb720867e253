//! Eureka's wire forms, kept at the edge: [`json`] reads and writes the documents servers and
//! clients exchange (and converts them to the plain model), [`read`] reads them as they
//! stream in, [`xml`] writes them for the clients that read only XML, [`replication`] is
//! what registries send each other.

pub mod json;
pub mod read;
pub mod replication;
// Public so that the fuzz targets (fuzz/) can write any document with it.
pub mod xml;

use std::io::Write;

/// `bytes` gzip-compressed, at the fast level: a registry's JSON shrinks ~10× at a few
/// hundred MB/s, where the default level costs several times the CPU for a few percent more.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing into a Vec fails only when memory does, which aborts anyway.
    encoder.write_all(bytes).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}
