//! TLS for the secure (`.svip`) path: a throwaway certificate authority and server
//! certificates made with the `openssl` command, and a TLS upstream (`demo/upstream.py`
//! with `--cert/--key`) that reports `"tls": true` in its JSON answers; and a blocking TLS
//! client ([`TlsClient`]) that says which certificate a server presented.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::paths::{free_port, repo_root};
use crate::process::{ChildGuard, TestEnv};
use crate::wait::wait_for;

/// How long the Python upstream may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A certificate and its private key, PEM files.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl CertifiedKey {
    /// The certificate (the first of the file), as a server presents it.
    pub fn leaf(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(&self.cert)
            .unwrap_or_else(|e| panic!("{}: {e}", self.cert.display()))
    }

    /// Copies the certificate and key to `cert` and `key`, each written beside its place and
    /// renamed over it, as an operator rotating them should; the key first.
    pub fn install(&self, cert: &Path, key: &Path) {
        for (from, to) in [(&self.key, key), (&self.cert, cert)] {
            let tmp = to.with_extension("new");
            std::fs::copy(from, &tmp)
                .and_then(|_| std::fs::rename(&tmp, to))
                .unwrap_or_else(|e| {
                    panic!("cannot install {} as {}: {e}", from.display(), to.display())
                });
        }
    }
}

/// A test certificate authority in a folder: `<name>-ca.pem` and `<name>-ca.key`.
#[derive(Debug)]
pub struct TestCa {
    name: String,
    dir: PathBuf,
    ca: CertifiedKey,
}

impl TestCa {
    /// Makes a new CA (P-256 key, valid one day) in `dir`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let ca = CertifiedKey {
            cert: dir.join(format!("{name}-ca.pem")),
            key: dir.join(format!("{name}-ca.key")),
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN=odmesh test CA {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &path_str(&ca.key),
            "-out",
            &path_str(&ca.cert),
        ]);
        TestCa {
            name: name.to_owned(),
            dir: dir.to_owned(),
            ca,
        }
    }

    /// The CA certificate (what `--upstream-ca` takes).
    pub fn cert(&self) -> &Path {
        &self.ca.cert
    }

    /// Issues a server certificate whose only subject alternative name is `DNS:<dns_name>`,
    /// as `<ca name>-<dns_name>.pem` and `.key`.
    pub fn issue(&self, dns_name: &str) -> CertifiedKey {
        self.issue_for(dns_name, "serverAuth")
    }

    /// Issues a client certificate (for mTLS) for `name`, as `<ca name>-<name>.pem` and
    /// `.key`.
    pub fn issue_client(&self, name: &str) -> CertifiedKey {
        self.issue_for(name, "clientAuth")
    }

    /// A certificate for `DNS:<dns_name>` with extended key usage `usage`.
    fn issue_for(&self, dns_name: &str, usage: &str) -> CertifiedKey {
        let base = self.dir.join(format!("{}-{dns_name}", self.name));
        let issued = CertifiedKey {
            cert: base.with_extension("pem"),
            key: base.with_extension("key"),
        };
        let csr = base.with_extension("csr");
        let ext = base.with_extension("ext");
        std::fs::write(
            &ext,
            format!(
                "subjectAltName=DNS:{dns_name}\nbasicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", ext.display()));
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={dns_name}"),
            "-keyout",
            &path_str(&issued.key),
            "-out",
            &path_str(&csr),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path_str(&csr),
            "-CA",
            &path_str(&self.ca.cert),
            "-CAkey",
            &path_str(&self.ca.key),
            "-set_serial",
            "1",
            "-days",
            "1",
            "-extfile",
            &path_str(&ext),
            "-out",
            &path_str(&issued.cert),
        ]);
        issued
    }
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Runs `openssl args`; panics with its output if it fails.
fn openssl(args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (is it installed?): {e}"));
    assert!(
        output.status.success(),
        "openssl {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `demo/upstream.py` serving TLS with a given certificate; killed when dropped.
pub struct TlsUpstream {
    _process: ChildGuard,
    addr: SocketAddr,
}

impl TlsUpstream {
    /// Starts the demo upstream for `app` over TLS with `identity` on a free port, and waits
    /// until it listens. Its log is `<label>.log`.
    pub fn start(env: &TestEnv, label: &str, app: &str, identity: &CertifiedKey) -> TlsUpstream {
        let port = free_port();
        let mut command = Command::new("python3");
        command
            .arg("-u")
            .arg(repo_root().join("demo/upstream.py"))
            .args([
                "--app",
                app,
                "--instance",
                label,
                "--port",
                &port.to_string(),
            ])
            .arg("--cert")
            .arg(&identity.cert)
            .arg("--key")
            .arg(&identity.key);
        let mut process = env.spawn(label, command);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let what = format!("{label} (demo/upstream.py over TLS) to listen on {addr}");
        wait_for(START_TIMEOUT, &what, || {
            if let Some(status) = process.exit_status() {
                panic!("{label} exited with {status}; log:\n{}", process.log());
            }
            // The script prints this line once it listens with its socket wrapped in TLS. (No
            // probe connection: the script does TLS handshakes in its accept loop.)
            process
                .log()
                .contains("listening on https://")
                .then_some(())
        });
        TlsUpstream {
            _process: process,
            addr,
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// A blocking TLS client connection, its handshake done, over a socket whose reads and writes
/// time out.
pub struct TlsClient {
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl TlsClient {
    /// Connects to `addr` and completes a handshake for `server_name`, trusting only `ca`,
    /// offering `alpn`, with `client`'s certificate when given (mutual TLS). `Err` when the
    /// server refuses the handshake (with TLS 1.3 a refused client certificate shows at the
    /// first read: see [`TlsClient::refused`]).
    pub fn connect(
        addr: SocketAddr,
        ca: &Path,
        server_name: &str,
        client: Option<&CertifiedKey>,
        alpn: &[&str],
    ) -> io::Result<TlsClient> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(io::Error::other)? {
            roots
                .add(cert.map_err(io::Error::other)?)
                .map_err(io::Error::other)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots);
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some(client) => {
                let certs = CertificateDer::pem_file_iter(&client.cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(io::Error::other)?;
                let key = PrivateKeyDer::from_pem_file(&client.key).map_err(io::Error::other)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(io::Error::other)?
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let name = ServerName::try_from(server_name.to_owned()).map_err(io::Error::other)?;
        let mut conn =
            rustls::ClientConnection::new(Arc::new(config), name).map_err(io::Error::other)?;
        let mut tcp = TcpStream::connect_timeout(&addr, crate::http::CONNECT_TIMEOUT)?;
        tcp.set_read_timeout(Some(crate::http::IO_TIMEOUT))?;
        tcp.set_write_timeout(Some(crate::http::IO_TIMEOUT))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        Ok(TlsClient {
            stream: rustls::StreamOwned::new(conn, tcp),
        })
    }

    /// The certificate the server presented (its leaf).
    pub fn served(&self) -> CertificateDer<'static> {
        let certs = self.stream.conn.peer_certificates();
        certs
            .and_then(|certs| certs.first())
            .cloned()
            .unwrap_or_else(|| panic!("the server presented no certificate"))
    }

    /// The ALPN protocol agreed on, if any.
    pub fn alpn(&self) -> Option<String> {
        (self.stream.conn.alpn_protocol()).map(|p| String::from_utf8_lossy(p).into_owned())
    }

    /// Whether the server ends the connection (a refused client certificate, with TLS 1.3)
    /// within `within`, rather than leaving it open waiting for the client's first bytes.
    pub fn refused(mut self, within: Duration) -> bool {
        let _ = self.stream.sock.set_read_timeout(Some(within));
        let mut byte = [0u8; 1];
        match io::Read::read(&mut self.stream, &mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    /// Sends `request` on this connection and reads the answer (see
    /// [`crate::http::exchange_on`]).
    pub fn send(&mut self, request: &crate::Request) -> io::Result<crate::Response> {
        crate::http::exchange_on(&mut self.stream, request)
    }
}
