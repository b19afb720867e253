//! TLS pieces that more than one layer needs: where distributions keep the system CA bundle,
//! a rustls client (ring provider) that trusts the CAs of a PEM bundle, and the server
//! identity of the control plane's TLS listeners (xDS, the embedded registry), read and
//! checked at start, so that a wrong path or a key that does not match its certificate is a
//! start-up error naming the file, not a failed handshake later. [`ServerTls`] reads them
//! again when asked ([`crate::reload`]): new handshakes take the new files, established
//! connections keep theirs, and files that cannot be used are refused the same way.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

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
    /// The CA that signs the clients' certificates (mutual TLS); the bundle's error names it.
    #[error("the client CA cannot be used")]
    ClientCa(#[from] InvalidCaBundle),
    #[error("{path}: no client certificate can be verified with it")]
    ClientVerifier {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// A certificate chain and its private key, read from PEM files.
#[derive(Debug)]
pub struct ServerIdentity {
    cert_path: PathBuf,
    key_path: PathBuf,
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
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, InvalidTlsFile> {
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
    Ok(certs)
}

impl ServerIdentity {
    /// Reads `cert` (the chain, leaf first) and `key` (PKCS#8, PKCS#1 or SEC1) and checks
    /// that the key is the certificate's.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerIdentity, InvalidTlsFile> {
        let certs = certificates(cert)?;
        let key_pem = read(key)?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| InvalidTlsFile::Pem {
            path: key.to_owned(),
            what: "no private key in it",
            source: Some(e),
        })?;
        let identity = ServerIdentity {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            certs,
            key: private,
        };
        // Builds once to check that the key matches the certificate.
        identity.rustls_config(&[], None)?;
        Ok(identity)
    }

    /// A rustls server configuration with this identity, offering `alpn`; with `client_ca`
    /// (its path and its CAs), clients must present a certificate one of them signed.
    fn rustls_config(
        &self,
        alpn: &[&[u8]],
        client_ca: Option<(&Path, RootCertStore)>,
    ) -> Result<rustls::ServerConfig, InvalidTlsFile> {
        let invalid = |source| InvalidTlsFile::Identity {
            cert: self.cert_path.clone(),
            key: self.key_path.clone(),
            source,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(invalid)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some((path, roots)) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|source| InvalidTlsFile::ClientVerifier {
                            path: path.to_owned(),
                            source,
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(invalid)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// The ALPN protocol of an HTTP/1.1 server (the embedded registry).
pub const ALPN_HTTP1: &[&[u8]] = &[b"http/1.1"];
/// The ALPN protocol of an HTTP/2 server (xDS over gRPC).
pub const ALPN_H2: &[&[u8]] = &[b"h2"];

/// The files of a TLS server: its certificate chain and key, and, for mutual TLS, the CA
/// bundle its clients' certificates must be signed by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA bundle (PEM) of the clients' certificates; `None`: no client certificate asked.
    pub client_ca: Option<PathBuf>,
}

impl ServerTlsFiles {
    /// Reads the files into a rustls server configuration offering `alpn`.
    fn load(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, InvalidTlsFile> {
        let identity = ServerIdentity::load(&self.cert, &self.key)?;
        let client_ca = match &self.client_ca {
            Some(path) => Some((path.as_path(), load_bundle(path)?)),
            None => None,
        };
        identity.rustls_config(alpn, client_ca)
    }
}

/// A TLS server's configuration, read from its files at start and read again on
/// [`ServerTls::reload`]: each new handshake takes the configuration in force when it
/// starts, and connections already established keep theirs. Files that cannot be used are
/// refused and the configuration in force stays.
pub struct ServerTls {
    files: ServerTlsFiles,
    alpn: Vec<&'static [u8]>,
    config: RwLock<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads `files` and checks them (the key is the certificate's, the client CA usable),
    /// for a server offering `alpn` ([`ALPN_HTTP1`], [`ALPN_H2`]).
    pub fn load(
        files: ServerTlsFiles,
        alpn: &[&'static [u8]],
    ) -> Result<ServerTls, InvalidTlsFile> {
        let config = files.load(alpn)?;
        Ok(ServerTls {
            files,
            alpn: alpn.to_vec(),
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// The files it is read from.
    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// The configuration in force, for the next handshake.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// An acceptor for the next connection, with the configuration in force.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config())
    }

    /// Reads the files again and puts them in force for new handshakes; files that cannot
    /// be used are refused, and the configuration in force stays.
    pub fn reload(&self) -> Result<(), InvalidTlsFile> {
        let config = Arc::new(self.files.load(&self.alpn)?);
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }
}

impl crate::reload::Reload for ServerTls {
    fn files(&self) -> Vec<PathBuf> {
        let f = &self.files;
        [Some(&f.cert), Some(&f.key), f.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn reload(&self) -> Result<String, crate::reload::BoxError> {
        ServerTls::reload(self)?;
        Ok(match &self.files.client_ca {
            Some(ca) => format!(
                "certificate {}, client CA {}",
                self.files.cert.display(),
                ca.display()
            ),
            None => format!("certificate {}", self.files.cert.display()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::testdata;

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

    /// A copy of fixture `name` as `dir/as_name`, replaced by a rename.
    fn install(dir: &Path, name: &str, as_name: &str) -> PathBuf {
        let path = dir.join(as_name);
        let tmp = dir.join(format!("{as_name}.tmp"));
        std::fs::copy(testdata(name), &tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    /// A fresh folder for one test's files.
    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("odmesh-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A TLS client trusting both test CAs, with the test client certificate if `client`.
    fn client(client: bool) -> rustls::ClientConfig {
        let mut roots = load_bundle(&testdata("tls/ca.pem")).unwrap();
        roots.add_parsable_certificates(read_certificates(&testdata("tls/other-ca.pem")).unwrap());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        if !client {
            return builder.with_no_client_auth();
        }
        let certs = certificates(&testdata("tls/client.pem")).unwrap();
        let key = PrivateKeyDer::from_pem_file(testdata("tls/client.key")).unwrap();
        builder.with_client_auth_cert(certs, key).unwrap()
    }

    /// A handshake of `client` with a server taking its configuration from `tls`, over an
    /// in-memory pipe: the server's certificate, or why either side failed.
    async fn handshake(
        tls: &ServerTls,
        client: rustls::ClientConfig,
    ) -> Result<CertificateDer<'static>, String> {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let acceptor = tls.acceptor();
        let server = tokio::spawn(async move {
            // Kept open until the client has its answer.
            acceptor
                .accept(far)
                .await
                .map_err(|e| format!("server: {e}"))
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let wait = std::time::Duration::from_secs(10);
        let connected = tokio::time::timeout(wait, connector.connect(name, near)).await;
        let client = connected.unwrap().map_err(|e| format!("client: {e}"));
        // With TLS 1.3 the client is done before the server has checked its certificate.
        let served = tokio::time::timeout(wait, server).await.unwrap().unwrap();
        let client = client?;
        served?;
        Ok(client.get_ref().1.peer_certificates().unwrap()[0].clone())
    }

    fn leaf_of(name: &str) -> CertificateDer<'static> {
        certificates(&testdata(name)).unwrap().remove(0)
    }

    #[tokio::test]
    async fn a_reloaded_certificate_serves_the_next_handshake_and_a_bad_pair_keeps_the_old() {
        let dir = test_dir("reload");
        let files = ServerTlsFiles {
            cert: install(&dir, "tls/server.pem", "cert.pem"),
            key: install(&dir, "tls/server.key", "key.pem"),
            client_ca: None,
        };
        let tls = ServerTls::load(files, ALPN_HTTP1).unwrap();
        assert_eq!(
            handshake(&tls, client(false)).await,
            Ok(leaf_of("tls/server.pem"))
        );

        // A certificate without its key: refused, and the old pair still serves.
        install(&dir, "tls/other-server.pem", "cert.pem");
        let err = tls.reload().unwrap_err();
        assert!(matches!(err, InvalidTlsFile::Identity { .. }), "{err:?}");
        assert!(err.to_string().contains("cert.pem"), "{err}");
        assert_eq!(
            handshake(&tls, client(false)).await,
            Ok(leaf_of("tls/server.pem"))
        );
        // Not a certificate at all: refused too.
        std::fs::write(dir.join("cert.pem"), "garbage").unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(
            handshake(&tls, client(false)).await,
            Ok(leaf_of("tls/server.pem"))
        );

        // The new pair whole: the next handshake gets it.
        install(&dir, "tls/other-server.pem", "cert.pem");
        install(&dir, "tls/other-server.key", "key.pem");
        tls.reload().unwrap();
        assert_eq!(
            handshake(&tls, client(false)).await,
            Ok(leaf_of("tls/other-server.pem"))
        );
    }

    #[tokio::test]
    async fn a_reloaded_client_ca_decides_the_next_handshakes_client_certificate() {
        let dir = test_dir("client-ca");
        let files = ServerTlsFiles {
            cert: testdata("tls/server.pem"),
            key: testdata("tls/server.key"),
            client_ca: Some(install(&dir, "tls/ca.pem", "clients.pem")),
        };
        let tls = ServerTls::load(files, ALPN_H2).unwrap();
        assert!(handshake(&tls, client(true)).await.is_ok());
        assert!(
            handshake(&tls, client(false)).await.is_err(),
            "no client certificate"
        );

        // A client CA that is not one: refused; the old CA still decides.
        install(&dir, "tls/broken-ca.pem", "clients.pem");
        let err = tls.reload().unwrap_err();
        assert!(matches!(err, InvalidTlsFile::ClientCa(_)), "{err:?}");
        assert!(handshake(&tls, client(true)).await.is_ok());

        // Another CA: the test client's certificate (signed by ca.pem) is refused from now on.
        install(&dir, "tls/other-ca.pem", "clients.pem");
        tls.reload().unwrap();
        assert!(handshake(&tls, client(true)).await.is_err());
    }

    #[test]
    fn an_error_shows_its_cause_once() {
        use crate::error::{Chain, repeats_its_cause};
        let missing = Path::new("/nonexistent/odmesh/cert.pem");
        let cert_only = temp(
            "cert-only-chain.pem",
            "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        );
        let broken_client_ca = ServerTlsFiles {
            cert: testdata("tls/server.pem"),
            key: testdata("tls/server.key"),
            client_ca: Some(testdata("tls/broken-ca.pem")),
        };
        let errors: [Box<dyn std::error::Error>; 5] = [
            Box::new(load_bundle(&testdata("tls/nosuch.pem")).unwrap_err()),
            Box::new(load_bundle(&testdata("tls/broken-ca.pem")).unwrap_err()),
            Box::new(ServerIdentity::load(missing, missing).unwrap_err()),
            Box::new(ServerIdentity::load(&cert_only, &cert_only).unwrap_err()),
            Box::new(ServerTls::load(broken_client_ca, ALPN_H2).unwrap_err()),
        ];
        for e in errors {
            let e = e.as_ref();
            assert!(e.source().is_some(), "{e}: its cause is kept");
            assert!(!repeats_its_cause(e), "{}", Chain(e));
        }
    }
}
