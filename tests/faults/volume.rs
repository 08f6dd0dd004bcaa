//! The filesystems the faults are made on, mounted by the test itself and always unmounted by a guard.
//!
//! A [`Mount`] is unmounted when dropped, even when the test panics; the test's server guards are declared
//! after it, so they are dropped (killed) first and nothing holds the filesystem by then. A mount that still
//! refuses to go after five seconds is detached lazily, so a failed run never leaves a mount behind.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// ENOSPC and EROFS on Linux.
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;

/// True when the test runs as root (`id -u` is 0).
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program).args(args).output().map_err(|e| format!("`{program}` cannot run: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// Mounting is this test's premise: without it there is no fault to observe, so a refusal fails loudly.
fn mount_or_fail(args: &[&str], what: &str) {
    if let Err(e) = run("mount", args) {
        panic!(
            "cannot mount the {what} this test needs: {e}\nThe storage fault tests mount their own small \
             filesystems: run them as root with CAP_SYS_ADMIN (in a container: --cap-add SYS_ADMIN, and access \
             to /dev/loop* for the ext4 image)."
        );
    }
}

pub struct Mount {
    pub point: PathBuf,
    /// The `mount` arguments, kept to mount the same filesystem again.
    args: Vec<String>,
}

impl Mount {
    /// A tmpfs of `size_mib` MiB at `point` (created if needed).
    pub fn tmpfs(point: &Path, size_mib: u64) -> Mount {
        std::fs::create_dir_all(point).expect("mount point");
        let point_text = point.to_string_lossy().into_owned();
        let args =
            vec!["-t".into(), "tmpfs".into(), "-o".into(), format!("size={size_mib}m"), "tmpfs".into(), point_text];
        Mount::new(point, args, "tmpfs")
    }

    /// An ext4 filesystem of `size_mib` MiB in the file `image`, loop-mounted at `point`. No journal, and
    /// `errors=remount-ro`, so that [`Mount::make_read_only`] can send it into the kernel's emergency
    /// read-only state.
    pub fn ext4_image(image: &Path, size_mib: u64, point: &Path) -> Mount {
        std::fs::create_dir_all(point).expect("mount point");
        File::create(image).and_then(|f| f.set_len(size_mib << 20)).expect("image file");
        let image_text = image.to_string_lossy().into_owned();
        if let Err(e) = run("mkfs.ext4", &["-q", "-F", "-O", "^has_journal", &image_text]) {
            panic!("cannot make the ext4 image the read-only test needs: {e} (is e2fsprogs installed?)");
        }
        let args = ["-o", "loop,errors=remount-ro", &image_text, &point.to_string_lossy()].map(String::from).to_vec();
        Mount::new(point, args, "loop-mounted ext4 image")
    }

    fn new(point: &Path, args: Vec<String>, what: &str) -> Mount {
        let borrowed: Vec<&str> = args.iter().map(String::as_str).collect();
        mount_or_fail(&borrowed, what);
        Mount { point: point.to_owned(), args }
    }

    /// Unmounts and mounts the same filesystem again: how an operator ends a read-only fault once its cause
    /// is fixed. Nothing may hold the filesystem open.
    pub fn mount_again(&self) {
        if let Err(e) = run("umount", &[&self.point.to_string_lossy()]) {
            panic!("cannot unmount {} to mount it again: {e}", self.point.display());
        }
        let borrowed: Vec<&str> = self.args.iter().map(String::as_str).collect();
        mount_or_fail(&borrowed, "filesystem again");
    }

    /// Sends this ext4 filesystem into the kernel's emergency read-only state, as a real filesystem error
    /// would under `errors=remount-ro`: from then on every write, through already open files too, fails with
    /// EROFS, until the filesystem is unmounted. An ordinary `mount -o remount,ro` cannot do this while a
    /// file is open for writing (the kernel answers EBUSY), and the store always has one open.
    pub fn make_read_only(&self) {
        let device = device_of(&self.point).unwrap_or_else(|| panic!("no device mounted at {}", self.point.display()));
        let name = device.rsplit('/').next().unwrap_or(&device).to_owned();
        let trigger = format!("/sys/fs/ext4/{name}/trigger_fs_error");
        if let Err(e) = std::fs::write(&trigger, "1") {
            panic!("cannot trigger an ext4 error through {trigger}: {e}");
        }
        match File::create(self.point.join("probe")) {
            Err(e) if e.raw_os_error() == Some(EROFS) => {}
            other => panic!("{} did not become read-only after {trigger}: creating a file gave {other:?}", name),
        }
    }

    /// Fills the filesystem with a file named `filler` until the kernel answers ENOSPC; returns its size.
    pub fn fill(&self) -> u64 {
        let mut file = OpenOptions::new().create(true).write(true).truncate(true).open(self.filler()).expect("filler");
        let chunk = vec![0u8; 64 << 10];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.point.display()),
            }
        }
        // tmpfs hands out whole pages, so after the large writes a small one may still find room: write byte by
        // byte until it does not, so that the store's next write certainly finds the disk full.
        while file.write(&[0]).is_ok_and(|n| n == 1) {
            written += 1;
        }
        written
    }

    /// Ends the disk-full fault.
    pub fn unfill(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }

    fn filler(&self) -> PathBuf {
        self.point.join("filler")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let point = self.point.to_string_lossy().into_owned();
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(5) {
            if run("umount", &[&point]).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Err(e) = run("umount", &["-l", &point]) {
            eprintln!("faults: could not unmount {point}, unmount it by hand: {e}");
        }
    }
}

/// The device mounted at `point`, from /proc/self/mounts (the last mount there wins, as in the kernel).
fn device_of(point: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let point = point.to_string_lossy();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next()?;
            (fields.next()? == point).then(|| device.to_owned())
        })
        .next_back()
}
