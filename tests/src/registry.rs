//! The control plane's registry file, in the short YAML form (docs/registry-formats.md),
//! written by a test: atomically (a temporary file renamed over it) or in place.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// One registry instance. [`Instance::new`] makes an `UP` instance of `app` on
/// `127.0.0.1:<port>`, whose VIP is the app's name.
#[derive(Clone, Debug)]
pub struct Instance {
    app: String,
    id: Option<String>,
    port: Option<u16>,
    secure_port: Option<u16>,
    vip: Option<String>,
    svip: Option<String>,
    status: String,
    protocol: Option<String>,
}

impl Instance {
    /// An `UP` instance of `app` on `127.0.0.1:port` (the VIP side).
    pub fn new(app: &str, port: u16) -> Instance {
        Instance {
            app: app.to_owned(),
            id: None,
            port: Some(port),
            secure_port: None,
            vip: None,
            svip: None,
            status: "UP".to_owned(),
            protocol: None,
        }
    }

    /// An `UP` instance of `app` with only a secure port on `127.0.0.1:secure_port`.
    pub fn secure(app: &str, secure_port: u16) -> Instance {
        Instance {
            port: None,
            secure_port: Some(secure_port),
            ..Instance::new(app, 0)
        }
    }

    /// Sets the instance id (default: derived by the control plane).
    pub fn id(mut self, id: &str) -> Instance {
        self.id = Some(id.to_owned());
        self
    }

    /// Sets the VIP list (comma-separated).
    pub fn vip(mut self, vip: &str) -> Instance {
        self.vip = Some(vip.to_owned());
        self
    }

    /// Sets the SVIP list (comma-separated).
    pub fn svip(mut self, svip: &str) -> Instance {
        self.svip = Some(svip.to_owned());
        self
    }

    /// Sets the status (`UP`, `DOWN`, `STARTING`, `OUT_OF_SERVICE`, `UNKNOWN`).
    pub fn status(mut self, status: &str) -> Instance {
        self.status = status.to_owned();
        self
    }

    /// Declares the HTTP protocol the instance speaks (`auto`, `http1`, `http2`): the field
    /// `protocol` in the file, the metadata entry `odmesh.protocol` in Eureka.
    pub fn protocol(mut self, protocol: &str) -> Instance {
        self.protocol = Some(protocol.to_owned());
        self
    }

    /// The app's name as Eureka spells it (uppercase).
    pub fn eureka_app(&self) -> String {
        self.app.to_ascii_uppercase()
    }

    /// The instance as a Eureka server lists it in `GET /eureka/apps` (JSON): the same
    /// instance the YAML form describes (id default `127.0.0.1:<app>:<port>`, as Spring
    /// Cloud names instances).
    pub fn to_eureka(&self) -> Value {
        let vip = self.vip.clone().unwrap_or_else(|| self.app.clone());
        let svip = self.svip.clone().unwrap_or_else(|| vip.clone());
        let id = self.id.clone().unwrap_or_else(|| {
            let port = self.port.or(self.secure_port).unwrap_or(0);
            format!("127.0.0.1:{}:{port}", self.app)
        });
        let port = |port: Option<u16>, default: u16| json!({"$": port.unwrap_or(default), "@enabled": port.is_some().to_string()});
        let mut instance = json!({
            "instanceId": id,
            "hostName": "127.0.0.1",
            "app": self.eureka_app(),
            "ipAddr": "127.0.0.1",
            "status": self.status,
            "overriddenStatus": "UNKNOWN",
            "port": port(self.port, 80),
            "securePort": port(self.secure_port, 443),
            "vipAddress": vip,
            "dataCenterInfo": {
                "@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
                "name": "MyOwn"
            },
            "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90},
            "metadata": {"@class": "java.util.Collections$EmptyMap"}
        });
        if self.secure_port.is_some() || self.svip.is_some() {
            instance["secureVipAddress"] = Value::String(svip);
        }
        if let Some(protocol) = &self.protocol {
            instance["metadata"] = json!({ "odmesh.protocol": protocol });
        }
        instance
    }

    fn write_yaml(&self, out: &mut String) {
        let _ = writeln!(out, "  - app: {}", self.app);
        let _ = writeln!(out, "    ip: 127.0.0.1");
        if let Some(id) = &self.id {
            let _ = writeln!(out, "    id: {id}");
        }
        if let Some(port) = self.port {
            let _ = writeln!(out, "    port: {port}");
        }
        if let Some(port) = self.secure_port {
            let _ = writeln!(out, "    secure_port: {port}");
        }
        if let Some(vip) = &self.vip {
            let _ = writeln!(out, "    vip: \"{vip}\"");
        }
        if let Some(svip) = &self.svip {
            let _ = writeln!(out, "    svip: \"{svip}\"");
        }
        let _ = writeln!(out, "    status: {}", self.status);
        if let Some(protocol) = &self.protocol {
            let _ = writeln!(out, "    protocol: {protocol}");
        }
    }
}

/// The registry as YAML text.
pub fn registry_yaml(instances: &[Instance]) -> String {
    let mut out = String::from("# written by an odmesh end-to-end test\ninstances:");
    if instances.is_empty() {
        out.push_str(" []\n");
        return out;
    }
    out.push('\n');
    for instance in instances {
        instance.write_yaml(&mut out);
    }
    out
}

/// A registry file in a test's folder.
#[derive(Clone, Debug)]
pub struct RegistryFile {
    path: PathBuf,
}

impl RegistryFile {
    /// A registry file at `path`, written atomically with `instances`.
    pub fn create(path: &Path, instances: &[Instance]) -> RegistryFile {
        let file = RegistryFile {
            path: path.to_owned(),
        };
        file.write_atomic(instances);
        file
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the registry by writing a temporary file beside it and renaming it over it,
    /// as deployment tools do.
    pub fn write_atomic(&self, instances: &[Instance]) {
        self.write_text_atomic(&registry_yaml(instances));
    }

    /// Replaces the registry by rewriting the file itself (truncate and write).
    pub fn write_in_place(&self, instances: &[Instance]) {
        self.write_text_in_place(&registry_yaml(instances));
    }

    /// Writes `text` (valid or not) atomically: a temporary file renamed over the registry.
    pub fn write_text_atomic(&self, text: &str) {
        let tmp = self.path.with_extension("yaml.tmp");
        fs::write(&tmp, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
        fs::rename(&tmp, &self.path).unwrap_or_else(|e| {
            panic!(
                "cannot rename {} over {}: {e}",
                tmp.display(),
                self.path.display()
            )
        });
    }

    /// Writes `text` (valid or not) into the registry file itself.
    pub fn write_text_in_place(&self, text: &str) {
        fs::write(&self.path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.path.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_written_in_the_short_yaml_form() {
        let yaml = registry_yaml(&[
            Instance::new("hello", 8080).id("hello-1"),
            Instance::secure("pay", 8443)
                .svip("pay.secure")
                .status("DOWN"),
        ]);
        assert_eq!(
            yaml,
            "# written by an odmesh end-to-end test\ninstances:\n  - app: hello\n    ip: 127.0.0.1\n    id: hello-1\n    port: 8080\n    status: UP\n  - app: pay\n    ip: 127.0.0.1\n    secure_port: 8443\n    svip: \"pay.secure\"\n    status: DOWN\n"
        );
        assert!(registry_yaml(&[]).ends_with("instances: []\n"));
    }

    #[test]
    fn an_instance_reads_as_eureka_json_with_its_ports_vips_and_status() {
        let plain = Instance::new("hello", 8080)
            .status("OUT_OF_SERVICE")
            .to_eureka();
        assert_eq!(plain["instanceId"], "127.0.0.1:hello:8080");
        assert_eq!(plain["app"], "HELLO");
        assert_eq!(plain["status"], "OUT_OF_SERVICE");
        assert_eq!(plain["port"], json!({"$": 8080, "@enabled": "true"}));
        assert_eq!(plain["securePort"]["@enabled"], "false");
        assert_eq!(plain["vipAddress"], "hello");
        assert!(plain.get("secureVipAddress").is_none());
        let secure = Instance::secure("pay", 8443)
            .id("pay-1")
            .svip("pay.secure")
            .to_eureka();
        assert_eq!(secure["instanceId"], "pay-1");
        assert_eq!(secure["port"]["@enabled"], "false");
        assert_eq!(secure["securePort"], json!({"$": 8443, "@enabled": "true"}));
        assert_eq!(secure["secureVipAddress"], "pay.secure");
    }
}
