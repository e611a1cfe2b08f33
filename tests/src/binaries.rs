//! The real `switchback-operator` and `switchback-proxy` binaries, built once by cargo
//! and run as child processes that are killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds the two binaries (debug profile, as the tests themselves) and returns the
/// folder holding them.
pub fn build() -> PathBuf {
    cargo_build(&[]);
    // target/debug/deps/<test>-<hash> -> target/debug
    profile_dir()
}

/// Builds the two binaries with the release profile, as they ship, and returns the
/// folder holding them: for benchmarks, whose figures a debug build would misstate
/// (a debug operator spends about ten times the CPU on a bulk apply, taken from the
/// API server it shares the machine with).
pub fn build_release() -> PathBuf {
    cargo_build(&["--release"]);
    profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("release")
}

fn cargo_build(extra: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "switchback-operator",
            "-p",
            "switchback-proxy",
        ])
        .args(extra)
        .current_dir(workspace())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the binaries failed");
}

/// target/<profile> of the running test binary (target/<profile>/deps/<test>-<hash>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// A child process, killed on drop.
pub struct Process {
    name: &'static str,
    child: Child,
    /// Where its output goes, if not to ours: its tail is printed when it exits
    /// unexpectedly, the one clue a failed run leaves in CI's output.
    log: Option<PathBuf>,
    /// Ended by [`Process::stop`], so its exit is no news.
    stopped: bool,
}

impl Process {
    /// Starts `bin` with `args`, logging at info (or `SWITCHBACK_TEST_LOG`, a
    /// `SWITCHBACK_LOG` filter for every child of a test run), with these extra environment
    /// variables; its output goes to `log` (appended) or, without one, to ours.
    pub fn spawn(
        name: &'static str,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Process {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env(
                "SWITCHBACK_LOG",
                std::env::var("SWITCHBACK_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        if let Some(log) = log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
            cmd.stdout(file.try_clone().expect("a second handle on the log"))
                .stderr(file);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        Process {
            name,
            child,
            log: log.map(Path::to_path_buf),
            stopped: false,
        }
    }

    /// Starts `cmd` as it is (its environment included), its stdout and stderr
    /// appended to `log`.
    pub fn spawn_command(name: &'static str, mut cmd: Command, log: &Path) -> Process {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().expect("a second handle on the log"))
            .stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Process {
            name,
            child,
            log: Some(log.to_path_buf()),
            stopped: false,
        }
    }

    pub fn start(name: &'static str, bin: &Path, args: &[String]) -> Process {
        Self::spawn(name, bin, args, &[], None)
    }

    /// Starts `bin` with its stdout and stderr appended to `log`.
    pub fn start_logged(name: &'static str, bin: &Path, args: &[String], log: &Path) -> Process {
        Self::spawn(name, bin, args, &[], Some(log))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until the process's log, past byte `from`, holds `needle`. Err carries the
    /// log's tail when the process exits first or `within` passes.
    pub fn wait_for_log(
        &mut self,
        from: u64,
        needle: &str,
        within: std::time::Duration,
    ) -> Result<(), String> {
        self.wait_for_any_log(from, &[needle], within).map(|_| ())
    }

    /// Like [`Process::wait_for_log`], for the first of several needles: which one.
    pub fn wait_for_any_log(
        &mut self,
        from: u64,
        needles: &[&str],
        within: std::time::Duration,
    ) -> Result<usize, String> {
        let needle = needles.join("\" or \"");
        let log = self.log.clone().expect("a process started with a log");
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            let fresh = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
            if let Some(i) = needles.iter().position(|n| fresh.contains(n)) {
                return Ok(i);
            }
            if let Some(status) = self.exited() {
                self.stopped = true;
                return Err(format!(
                    "{} exited ({status}) before logging {needle:?}:\n{}",
                    self.name,
                    tail(&log, 30)
                ));
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "{} did not log {needle:?} within {within:?}:\n{}",
                    self.name,
                    tail(&log, 30)
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts a server process on ports from [`free_ports`] (`args` builds its
    /// arguments from them) and waits for `ready` in its log. Ports released by
    /// `free_ports` can be taken by another process before the child binds them: a
    /// child that exits saying so, or says it waits for one (the proxy's
    /// `--listen-wait`), is started again on fresh ports (up to 5 times).
    pub fn start_listening<const N: usize>(
        name: &'static str,
        bin: &Path,
        args: impl Fn([u16; N]) -> Vec<String>,
        log: &Path,
        ready: &str,
    ) -> (Process, [u16; N]) {
        let mut tries = 0;
        loop {
            tries += 1;
            let ports = free_ports::<N>();
            let from = log_len(log);
            let mut process = Process::start_logged(name, bin, &args(ports), log);
            let within = std::time::Duration::from_secs(60);
            match process.wait_for_any_log(from, &[ready, "is in use; waiting"], within) {
                Ok(0) => return (process, ports),
                Ok(_) if tries < 5 => {
                    process.stop();
                    eprintln!("{name} found {ports:?} in use, starting it again");
                }
                Err(e) if e.contains("in use") && tries < 5 => {
                    eprintln!("{name} could not bind {ports:?}, starting it again");
                }
                Ok(_) => panic!("{name}: {ports:?} in use 5 times"),
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    /// Starts the `switchback-proxy` binary `bin` standalone on `manifests`, on
    /// loopback ports of its own (see [`Process::start_listening`]), with `extra`
    /// arguments, its output appended to `log`; returns it with its data and admin
    /// ports once it serves.
    pub fn start_proxy(
        bin: &Path,
        manifests: &Path,
        log: &Path,
        extra: &[&str],
    ) -> (Process, [u16; 2]) {
        let args = |[data, admin]: [u16; 2]| proxy_args(manifests, data, admin, extra);
        Self::start_listening(
            "switchback-proxy",
            bin,
            args,
            log,
            "switchback-proxy serving",
        )
    }

    /// Waits up to `within` for the process to exit (as it should: its exit is no
    /// news); its status. Panics with the log's tail if it does not.
    pub fn wait_exit(&mut self, within: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                self.stopped = true;
                return status;
            }
            if std::time::Instant::now() > deadline {
                let log = self.log.as_deref().map_or(String::new(), |l| tail(l, 30));
                panic!("{} did not exit within {within:?}:\n{log}", self.name);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Sends it signal `name` (`TERM`, `INT`, ...) with `kill`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {}", self.pid());
    }

    pub fn stop(&mut self) {
        self.stopped = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.stopped
            && let Some(status) = self.exited()
        {
            eprintln!("{} had exited: {status}", self.name);
            if let Some(log) = &self.log {
                eprintln!("the end of {}:\n{}", log.display(), tail(log, 30));
            }
        }
        self.stop();
    }
}

/// The arguments of a standalone `switchback-proxy` serving `manifest` on loopback
/// ports `data` and `admin`, then `extra`.
pub fn proxy_args(manifest: &Path, data: u16, admin: u16, extra: &[&str]) -> Vec<String> {
    let (data, admin) = (format!("127.0.0.1:{data}"), format!("127.0.0.1:{admin}"));
    let manifest = manifest.to_str().expect("a UTF-8 path");
    [
        "--manifests",
        manifest,
        "--listen",
        &data,
        "--admin-listen",
        &admin,
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(str::to_owned)
    .collect()
}

/// `/metrics` of the admin port on loopback port `admin`, on a new connection.
pub async fn scrape(admin: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .expect("the admin port answers")
        .text()
        .await
        .expect("a /metrics body")
}

/// The value of the series `series` (name and labels, as written) in a Prometheus
/// text document, if it is there.
pub fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `N` distinct free loopback ports for a child process to listen on. The listeners
/// are held together until all are chosen (ports chosen one at a time may repeat) and
/// released on return, so another process can still take one before the child binds
/// it: start children with [`Process::start_listening`], which retries that case.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("a bound address").port())
}

/// The last `lines` lines of `log` (or why it cannot be read).
pub fn tail(log: &Path, lines: usize) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({}: {e})", log.display()),
    }
}

/// The length of `log` now: where the output of a process started next begins.
pub fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}
