//! A small tmpfs for the disk-full tests (the engine's and the server's), shared by path.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `size` mounted on a fresh directory, unmounted (and the directory removed) on
/// drop. Fails the test loudly when mounting is not possible.
pub struct Tmpfs {
    mount: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let parent = tempfile::tempdir().expect("a temporary directory");
        let mount = parent.path().join("mnt");
        std::fs::create_dir(&mount).expect("create the mount point");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mount)
            .output()
            .expect("run mount(8)");
        assert!(
            output.status.success(),
            "mounting a {size} tmpfs at {} failed: {} (the disk-full tests need root and tmpfs; \
             they fail rather than skip)",
            mount.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Tmpfs {
            mount,
            _parent: parent,
        }
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.mount)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a test failed with files open): detach it so it goes once closed.
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}
