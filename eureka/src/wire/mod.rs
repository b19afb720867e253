//! Eureka's wire forms, kept at the edge: [`json`] reads and writes the documents servers and
//! clients exchange (and converts them to the plain model), [`read`] reads them as they
//! stream in, [`xml`] writes them for the clients that read only XML.

pub mod json;
pub mod read;
// Public so that the fuzz targets (fuzz/) can write any document with it.
pub mod xml;
