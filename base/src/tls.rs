//! TLS pieces that more than one layer needs: where distributions keep the system CA bundle,
//! a rustls client (ring provider) that trusts the CAs of a PEM bundle, and the server
//! identity of the control plane's TLS listeners (xDS, the embedded registry), read and
//! checked at start, so that a wrong path or a key that does not match its certificate is a
//! start-up error naming the file, not a failed handshake later.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where distributions keep the system CA bundle, most common first.
pub const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A CA bundle that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum InvalidCaBundle {
    #[error("CA bundle {}: cannot read it", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CA bundle {}: not a PEM file", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("CA bundle {}: no certificate in it (expected -----BEGIN CERTIFICATE-----)", path.display())]
    Empty { path: PathBuf },
    #[error("CA bundle {}: certificate {number} is not a usable CA certificate", path.display())]
    Certificate {
        path: PathBuf,
        /// 1 for the first certificate of the file.
        number: usize,
        #[source]
        source: rustls::Error,
    },
    #[error("no system CA bundle (looked for {})", candidates.join(", "))]
    NoSystemBundle { candidates: Vec<String> },
}

/// The first of `candidates` that is a file.
pub fn find_system_bundle(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Every certificate of the PEM bundle at `path`, as trust anchors. Each must be usable: a
/// bundle an operator names is refused whole, naming the certificate, rather than trusted in
/// part.
pub fn load_bundle(path: &Path) -> Result<RootCertStore, InvalidCaBundle> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in read_certificates(path)?.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|source| InvalidCaBundle::Certificate {
                path: path.to_owned(),
                number: i + 1,
                source,
            })?;
    }
    Ok(roots)
}

/// The system CA bundle, the first of `candidates` that exists, and its trust anchors. A
/// certificate in it that webpki cannot use is skipped (as `rustls-native-certs` does): the
/// distribution chose it, and the others still count.
pub fn load_system_bundle(
    candidates: &[&str],
) -> Result<(PathBuf, RootCertStore), InvalidCaBundle> {
    let path = find_system_bundle(candidates).ok_or_else(|| InvalidCaBundle::NoSystemBundle {
        candidates: candidates.iter().map(|c| (*c).to_owned()).collect(),
    })?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(read_certificates(&path)?);
    if added == 0 {
        return Err(InvalidCaBundle::Empty { path });
    }
    if ignored > 0 {
        tracing::debug!(path = %path.display(), ignored, "system CA certificates webpki cannot use were skipped");
    }
    Ok((path, roots))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, InvalidCaBundle> {
    let bytes = std::fs::read(path).map_err(|source| InvalidCaBundle::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| InvalidCaBundle::Pem {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(InvalidCaBundle::Empty {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// A rustls client configuration (ring; TLS 1.2 and 1.3) that trusts `roots` and verifies
/// the server's certificate and name as rustls does by default.
pub fn client_config(roots: RootCertStore) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The first [`rustls::Error`] behind `error`, following sources and the errors that
/// `std::io::Error`s wrap (whose `source()` skips them): what a TLS handshake failure says.
pub fn find_rustls_error<'a>(
    mut error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    loop {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|e| e as &(dyn std::error::Error + 'static));
        error = match inner {
            Some(inner) => inner,
            None => error.source()?,
        };
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidTlsFile {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Pem {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: Option<pem::Error>,
    },
    #[error("{cert} and {key} do not make a usable server identity")]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// A certificate chain and its private key, read from PEM files.
#[derive(Debug)]
pub struct ServerIdentity {
    cert_path: PathBuf,
    key_path: PathBuf,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn read(path: &Path) -> Result<Vec<u8>, InvalidTlsFile> {
    std::fs::read(path).map_err(|source| InvalidTlsFile::Io {
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file; at least one.
fn certificates(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), InvalidTlsFile> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| InvalidTlsFile::Pem {
            path: path.to_owned(),
            what: "not a PEM certificate file",
            source: Some(e),
        })?;
    if certs.is_empty() {
        return Err(InvalidTlsFile::Pem {
            path: path.to_owned(),
            what: "no certificate in it (expected -----BEGIN CERTIFICATE-----)",
            source: None,
        });
    }
    Ok((pem, certs))
}

impl ServerIdentity {
    /// Reads `cert` (the chain, leaf first) and `key` (PKCS#8, PKCS#1 or SEC1) and checks
    /// that the key is the certificate's.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerIdentity, InvalidTlsFile> {
        let (cert_pem, certs) = certificates(cert)?;
        let key_pem = read(key)?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| InvalidTlsFile::Pem {
            path: key.to_owned(),
            what: "no private key in it",
            source: Some(e),
        })?;
        let identity = ServerIdentity {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            cert_pem,
            key_pem,
            certs,
            key: private,
        };
        // Builds once to check that the key matches the certificate.
        identity.rustls_config(&[])?;
        Ok(identity)
    }

    /// A rustls server configuration with this identity, offering `alpn`.
    fn rustls_config(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, InvalidTlsFile> {
        let invalid = |source| InvalidTlsFile::Identity {
            cert: self.cert_path.clone(),
            key: self.key_path.clone(),
            source,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(invalid)?
            .with_no_client_auth()
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(invalid)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// A TLS acceptor for an HTTP/1.1 server (the embedded registry).
    pub fn https_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, InvalidTlsFile> {
        let config = self.rustls_config(&[b"http/1.1"])?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// tonic's TLS settings for the xDS server; with `client_ca`, clients must present a
    /// certificate signed by it (mTLS).
    pub fn grpc_config(
        &self,
        client_ca: Option<&Path>,
    ) -> Result<tonic::transport::ServerTlsConfig, InvalidTlsFile> {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = client_ca {
            let (pem, _) = certificates(ca)?;
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(pem));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path of fixture `name` under `base/testdata/`.
    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    #[test]
    fn a_pem_bundle_of_ca_certificates_loads() {
        let roots = load_bundle(&testdata("tls/ca.pem")).unwrap();
        assert_eq!(roots.len(), 1);
    }

    #[test]
    fn a_missing_file_a_file_without_certificates_or_a_broken_certificate_is_refused() {
        let err = load_bundle(&testdata("tls/nosuch.pem")).unwrap_err();
        assert!(matches!(err, InvalidCaBundle::Read { .. }), "{err:?}");
        assert!(
            err.to_string().contains("tls/nosuch.pem: cannot read"),
            "{err}"
        );

        let err = load_bundle(&testdata("tls/server.key")).unwrap_err();
        assert!(matches!(err, InvalidCaBundle::Empty { .. }), "{err:?}");
        assert!(err.to_string().contains("no certificate in it"), "{err}");

        let err = load_bundle(&testdata("tls/broken-ca.pem")).unwrap_err();
        assert!(
            matches!(err, InvalidCaBundle::Certificate { number: 2, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn without_a_system_bundle_the_error_lists_where_it_looked() {
        let err = load_system_bundle(&["/nonexistent/a.crt", "/nonexistent/b.pem"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no system CA bundle (looked for /nonexistent/a.crt, /nonexistent/b.pem)"
        );
        let (path, roots) = load_system_bundle(&[
            "/nonexistent/a.crt",
            testdata("tls/ca.pem").to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(path, testdata("tls/ca.pem"));
        assert_eq!(roots.len(), 1);
    }

    #[test]
    fn a_rustls_error_is_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            tls.clone(),
        ));
        assert_eq!(find_rustls_error(&wrapped), Some(&tls));
        assert_eq!(find_rustls_error(&std::io::Error::other("reset")), None);
    }

    fn temp(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("odmesh-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_that_names_it() {
        let missing = Path::new("/nonexistent/odmesh/cert.pem");
        let err = ServerIdentity::load(missing, missing).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/odmesh/cert.pem"),
            "{err}"
        );
        let empty = temp("empty.pem", "");
        let err = ServerIdentity::load(&empty, &empty).unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
    }

    #[test]
    fn a_certificate_without_a_key_is_an_error_that_names_the_key_file() {
        let cert = temp(
            "cert-only.pem",
            "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        );
        let err = ServerIdentity::load(&cert, &cert).unwrap_err();
        assert!(
            matches!(&err, InvalidTlsFile::Pem { path, .. } if *path == cert),
            "{err}"
        );
        assert!(err.to_string().contains("no private key"), "{err}");
    }

    #[test]
    fn an_error_shows_its_cause_once() {
        use crate::error::{Chain, repeats_its_cause};
        let missing = Path::new("/nonexistent/odmesh/cert.pem");
        let cert_only = temp(
            "cert-only-chain.pem",
            "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        );
        let errors: [Box<dyn std::error::Error>; 4] = [
            Box::new(load_bundle(&testdata("tls/nosuch.pem")).unwrap_err()),
            Box::new(load_bundle(&testdata("tls/broken-ca.pem")).unwrap_err()),
            Box::new(ServerIdentity::load(missing, missing).unwrap_err()),
            Box::new(ServerIdentity::load(&cert_only, &cert_only).unwrap_err()),
        ];
        for e in errors {
            let e = e.as_ref();
            assert!(e.source().is_some(), "{e}: its cause is kept");
            assert!(!repeats_its_cause(e), "{}", Chain(e));
        }
    }
}
