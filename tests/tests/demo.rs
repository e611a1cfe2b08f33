//! The README's first command must keep showing a fallback: run the demo example
//! (built by `cargo test` alongside the tests) with `--once` and read what it prints.

use std::path::PathBuf;
use std::process::Command;

fn demo_binary() -> PathBuf {
    // target/<profile>/deps/demo-<hash> → target/<profile>/examples/demo
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    profile_dir
        .join("examples")
        .join(format!("demo{}", std::env::consts::EXE_SUFFIX))
}

#[test]
fn the_demo_shows_retries_and_a_fallback() {
    let bin = demo_binary();
    assert!(
        bin.exists(),
        "{} is missing: cargo test builds examples",
        bin.display()
    );
    let out = Command::new(&bin)
        .arg("--once")
        .output()
        .expect("demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("request 1: 200 from team-a/steady-openai, 3 upstream attempt(s), FELL BACK past 1 target(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("request 2: 200 from team-a/flaky-openai, 1 upstream attempt(s), answered by the first target"),
        "{stdout}"
    );
    assert!(
        stdout.contains("The flaky provider saw 6 requests, the steady one 2."),
        "{stdout}"
    );
}
