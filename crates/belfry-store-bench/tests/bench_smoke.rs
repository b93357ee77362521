//! The benchmark binary runs end to end on a tiny workload and its checks pass (every task
//! drained, in due order, with verified payloads). No timing is asserted.

use std::process::Command;

#[test]
fn tiny_comparison_runs_and_drains_everything() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_belfry-store-bench"))
        .args([
            "--tasks",
            "3000",
            "--batch",
            "500",
            "--engines",
            "raw,belfry,fjall,memory",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run the benchmark");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for engine in ["raw", "belfry", "fjall", "memory"] {
        let row = stdout
            .lines()
            .find(|line| line.trim_start().starts_with(engine))
            .unwrap_or_else(|| panic!("no {engine} row in {stdout}"));
        assert!(
            row.trim_end().ends_with("ok"),
            "{engine} check failed: {row}"
        );
    }
}
