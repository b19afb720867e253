//! A headless browser for the pages people read (the registry's status page, the admin's
//! dashboard): Debian's `chromium`, which `scripts/install-test-tools.sh` installs (`make
//! e2e` runs it). [`Chromium::dump_dom`] returns the document as the browser built it (its
//! elements, not the bytes sent), [`Chromium::screenshot`] writes a PNG into the test's log
//! folder. Each run has a new empty profile and no network but the page's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::TestEnv;

/// How long one page may take to load and render.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The `chromium` binary.
#[derive(Clone, Debug)]
pub struct Chromium {
    binary: PathBuf,
}

impl Chromium {
    /// `$CHROMIUM`, else `chromium` on the `PATH`. Panics if there is none: a test that reads
    /// a page must not pass without a browser.
    pub fn find() -> Chromium {
        let on_path = || {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        };
        let binary = std::env::var_os("CHROMIUM")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(on_path)
            .filter(|p| p.is_file());
        match binary {
            Some(binary) => Chromium { binary },
            None => panic!(
                "chromium is not installed: run scripts/install-test-tools.sh (make e2e does), or set CHROMIUM=/path/to/chromium"
            ),
        }
    }

    /// The document at `url` after it loaded, serialised (`--dump-dom`); also written to
    /// `<label>.html` in the test's log folder.
    pub fn dump_dom(&self, env: &TestEnv, label: &str, url: &str) -> String {
        let out = env.log_dir().join(format!("{label}.html"));
        self.run(env, label, &["--dump-dom", url], &out);
        std::fs::read_to_string(&out)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", out.display()))
    }

    /// A screenshot of `url` (1280×900), written to `<label>.png` in the test's log folder;
    /// its path.
    pub fn screenshot(&self, env: &TestEnv, label: &str, url: &str) -> PathBuf {
        let png = env.log_dir().join(format!("{label}.png"));
        let _ = std::fs::remove_file(&png);
        let shot = format!("--screenshot={}", png.display());
        let out = env.log_dir().join(format!("{label}.out"));
        self.run(env, label, &[&shot, "--window-size=1280,900", url], &out);
        assert!(
            std::fs::metadata(&png).is_ok_and(|m| m.len() > 0),
            "chromium wrote no screenshot {}; see {label}.log",
            png.display()
        );
        png
    }

    /// Runs chromium with `args` after the flags every run needs, its stdout to `out`, its
    /// stderr to `<label>.log`, within [`TIMEOUT`] (killed if it takes longer, or if the test
    /// fails meanwhile).
    fn run(&self, env: &TestEnv, label: &str, args: &[&str], out: &Path) {
        let profile = env.log_dir().join(format!("{label}-profile"));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", profile.display()));
        // Run as root, chromium needs --no-sandbox; without the background-networking flags it
        // reaches for Google's servers.
        let profile_flag = format!("--user-data-dir={}", profile.display());
        let flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            &profile_flag,
        ];
        // The shell only points stdout at `out`, then becomes chromium.
        let mut command = Command::new("sh");
        command
            .args(["-c", "out=\"$1\"; shift; exec \"$@\" > \"$out\"", "sh"])
            .arg(out)
            .arg(&self.binary)
            .args(flags)
            .args(args);
        let mut process = env.spawn(label, command);
        let status = process.wait_exit(TIMEOUT);
        assert!(
            status.success(),
            "chromium {args:?} failed ({status}):\n{}",
            process.log()
        );
        let _ = std::fs::remove_dir_all(&profile);
    }
}

/// Every start tag of a serialised document (`<name attributes>`), lowercase, without the
/// angle brackets: in `--dump-dom`'s output, text never holds a `<` (it is written `&lt;`),
/// so each `<` that is not `</` or `<!` opens an element the browser made.
pub fn start_tags(dom: &str) -> Vec<String> {
    dom.split('<')
        .skip(1)
        .filter(|t| !t.starts_with('/') && !t.starts_with('!'))
        .filter_map(|t| t.split_once('>').map(|(tag, _)| tag.to_ascii_lowercase()))
        .collect()
}

/// The element name of a start tag from [`start_tags`].
pub fn tag_name(tag: &str) -> &str {
    tag.split(|c: char| c.is_whitespace() || c == '/')
        .next()
        .unwrap_or_default()
}
