//! A test's log folder and the child processes it runs, killed when the test ends.
//!
//! Logs: every test owns `tests/logs/<test-name>/` (git-ignored). [`TestEnv::new`] empties it,
//! so it always holds the last run of that test, passing or failing; when a test fails, its
//! [`TestEnv`] prints the folder and the tail of every log in it.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

use crate::paths::repo_root;
use crate::wait::wait_for;

/// How many lines of each log a failing test prints.
const TAIL_LINES: usize = 40;

/// One test's environment: its name and log folder. Create it first in a test, so it is
/// dropped last (after the processes), and prints the logs if the test failed.
pub struct TestEnv {
    name: String,
    dir: PathBuf,
}

impl TestEnv {
    /// Creates (or empties) `tests/logs/<name>/`. `name` is a file name: use the test's name.
    pub fn new(name: &str) -> TestEnv {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "a test name is a file name (a-z 0-9 _ -), got {name:?}"
        );
        let dir = repo_root().join("tests/logs").join(name);
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot empty the log folder {}: {e}", dir.display()));
        }
        fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create the log folder {}: {e}", dir.display()));
        TestEnv {
            name: name.to_owned(),
            dir,
        }
    }

    /// The test's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test's log folder, `tests/logs/<name>/`.
    pub fn log_dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `contents` to `file` in the log folder (e.g. a rendered bootstrap) and returns
    /// its path.
    pub fn write_file(&self, file: &str, contents: &str) -> PathBuf {
        let path = self.dir.join(file);
        fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Starts `command` with stdout and stderr both written to `<label>.log` in the log
    /// folder, and stdin closed. The process is killed when the guard is dropped.
    pub fn spawn(&self, label: &str, command: Command) -> ChildGuard {
        self.spawn_stdin(label, command, Stdio::null())
    }

    /// [`TestEnv::spawn`] with a pipe to the process's stdin, for a process that takes
    /// commands there; closing the pipe (dropping it) is its end of input.
    pub fn spawn_interactive(&self, label: &str, command: Command) -> (ChildGuard, ChildStdin) {
        let mut process = self.spawn_stdin(label, command, Stdio::piped());
        let stdin = process
            .child
            .stdin
            .take()
            .unwrap_or_else(|| panic!("{label} has no stdin pipe"));
        (process, stdin)
    }

    fn spawn_stdin(&self, label: &str, mut command: Command, stdin: Stdio) -> ChildGuard {
        let log = self.dir.join(format!("{label}.log"));
        let out = File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create the log {}: {e}", log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share the log {}: {e}", log.display()));
        command
            .stdin(stdin)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {label} ({command:?}): {e}"));
        ChildGuard {
            label: label.to_owned(),
            child,
            log,
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if !thread::panicking() {
            return;
        }
        eprintln!(
            "\n==== test {} failed; its logs are in {}",
            self.name,
            self.dir.display()
        );
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(TAIL_LINES);
            eprintln!(
                "---- {} (last {} lines)",
                log.display(),
                lines.len() - start
            );
            for line in &lines[start..] {
                eprintln!("{line}");
            }
        }
    }
}

/// A running child process, killed (and reaped) when dropped, also when a test panics.
pub struct ChildGuard {
    label: String,
    child: Child,
    log: PathBuf,
}

impl ChildGuard {
    /// The label the process was started with (its log is `<label>.log`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The path of the process's log (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the process has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .try_wait()
            .unwrap_or_else(|e| panic!("cannot check whether {} exited: {e}", self.label))
    }

    /// Kills the process (SIGKILL, as a crash would end it) and reaps it; does nothing if it
    /// has exited already.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// Waits at most `timeout` for the process to exit by itself and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let what = format!("{} (pid {}) to exit", self.label, self.id());
        wait_for(timeout, &what, || self.exit_status())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
