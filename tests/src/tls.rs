//! TLS for the secure (`.svip`) path: a throwaway certificate authority and server
//! certificates made with the `openssl` command, and a TLS upstream (`demo/upstream.py`
//! with `--cert/--key`) that reports `"tls": true` in its JSON answers.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
