//! `/init` of the lab's guest: mounts the kernel file systems, runs the steps of
//! `/lab/steps.json` one after the other (some in the background), prints each step's exit
//! status and sends its output and the files it names back over the console
//! (`etm_lab::proto`), then powers the machine off.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etm_lab::proto::{MARK, Step, b64_encode, fnv1a};

fn mount(src: &str, dst: &str, fstype: &str) {
    let _ = std::fs::create_dir_all(dst);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (s, d, t) = (c(src), c(dst), c(fstype));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let r = unsafe { libc::mount(s.as_ptr(), d.as_ptr(), t.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        say(&format!("warn mount {fstype} on {dst}: {}", std::io::Error::last_os_error()));
    }
}

/// One protocol line, written with a single write so it is not split by other output.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{MARK} {line}\n").as_bytes());
    let _ = out.flush();
}

fn send_file(step: &str, path: &str) {
    match std::fs::read(path) {
        Ok(data) => {
            say(&format!("file {step} {path} {} {:016x}", data.len(), fnv1a(&data)));
            let enc = b64_encode(&data);
            for chunk in enc.as_bytes().chunks(96) {
                say(&format!("d {}", std::str::from_utf8(chunk).expect("base64 is ASCII")));
            }
            say("end");
        }
        Err(e) => say(&format!("missing {step} {path} {e}")),
    }
}

/// The kernel log (`klogctl(SYSLOG_ACTION_READ_ALL)`), as the file `dmesg` of step `kernel`.
fn send_dmesg() {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as i32) };
    if n > 0 {
        buf.truncate(n as usize);
        let _ = std::fs::write("/tmp/lab/dmesg", &buf);
        send_file("kernel", "/tmp/lab/dmesg");
    }
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_else(|e| format!("?({e})"))
}

fn run_step(step: &Step, pids: &HashMap<String, u32>, spawned: &mut Vec<(String, Child)>) {
    let argv: Vec<String> = step
        .argv
        .iter()
        .map(|a| {
            let mut a = a.clone();
            for (name, pid) in pids {
                a = a.replace(&format!("{{pid:{name}}}"), &pid.to_string());
            }
            a
        })
        .collect();
    let (out_path, err_path) = (format!("/tmp/lab/{}.stdout", step.name), format!("/tmp/lab/{}.stderr", step.name));
    let files = std::fs::File::create(&out_path).and_then(|o| Ok((o, std::fs::File::create(&err_path)?)));
    let Ok((out, err)) = files else {
        say(&format!("rc {} error cannot create output files", step.name));
        return;
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, v) in &step.env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            say(&format!("rc {} error spawn {}: {e}", step.name, argv[0]));
            return;
        }
    };
    if step.spawn {
        say(&format!("spawned {} {}", step.name, child.id()));
        spawned.push((step.name.clone(), child));
        std::thread::sleep(Duration::from_millis(step.settle_ms));
        return;
    }
    // The timeout counts the 20 ms waits, not the clock: early in boot the monotonic clock of
    // an emulated guest can jump.
    let mut waits = 0u64;
    let status = loop {
        // Reap background steps that ended (this is PID 1: nobody else will).
        for (_, c) in spawned.iter_mut() {
            let _ = c.try_wait();
        }
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if waits * 20 > step.timeout_s * 1000 => {
                say(&format!("warn timeout {} after {waits} waits, clock {:?}", step.name, started.elapsed()));
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                waits += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                say(&format!("warn wait {}: {e}", step.name));
                break None;
            }
        }
    };
    let secs = started.elapsed().as_secs_f64();
    match status.map(|s| (s.code(), std::os::unix::process::ExitStatusExt::signal(&s))) {
        Some((Some(c), _)) => say(&format!("rc {} {c} {secs:.2}", step.name)),
        Some((None, Some(sig))) => say(&format!("rc {} signal{sig} {secs:.2}", step.name)),
        _ => say(&format!("rc {} timeout {secs:.2}", step.name)),
    }
    send_file(&step.name, &out_path);
    send_file(&step.name, &err_path);
    for f in &step.files {
        send_file(&step.name, f);
    }
    std::thread::sleep(Duration::from_millis(step.settle_ms));
}

fn main() {
    // `/init write FILE VALUE`: a step that sets a sysctl (the guest has no shell).
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "write" {
        match std::fs::write(&args[2], &args[3]) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("write {}: {e}", args[2]);
                std::process::exit(1);
            }
        }
    }
    mount("proc", "/proc", "proc");
    mount("sysfs", "/sys", "sysfs");
    mount("devtmpfs", "/dev", "devtmpfs");
    // No tmpfs over /tmp: the initramfs root is already writable memory, and a mount would
    // hide what the image put below /tmp (a checkout under /tmp places the test fixtures at
    // their compiled-in paths there).
    mount("bpf", "/sys/fs/bpf", "bpf");
    mount("debugfs", "/sys/kernel/debug", "debugfs");
    mount("tracefs", "/sys/kernel/tracing", "tracefs");
    let _ = std::fs::create_dir_all("/tmp/lab");
    // SAFETY: setenv before any thread is started.
    unsafe {
        std::env::set_var("PATH", "/lab/bin:/bin");
        std::env::set_var("HOME", "/tmp");
    }
    let pmus: Vec<String> = std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    say(&format!(
        "boot release={} machine={} cpus={} pmus={} btf={}",
        read_trim("/proc/sys/kernel/osrelease"),
        std::env::consts::ARCH,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        pmus.join(","),
        std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
    ));
    let steps: Vec<Step> = match std::fs::read("/lab/steps.json").map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            say(&format!("fatal steps.json: {e}"));
            Vec::new()
        }
        Err(e) => {
            say(&format!("fatal steps.json: {e}"));
            Vec::new()
        }
    };
    let mut spawned: Vec<(String, Child)> = Vec::new();
    for step in &steps {
        let pids: HashMap<String, u32> = spawned.iter().map(|(n, c)| (n.clone(), c.id())).collect();
        run_step(step, &pids, &mut spawned);
    }
    for (name, mut c) in spawned {
        let running = matches!(c.try_wait(), Ok(None));
        if running {
            let _ = c.kill();
        }
        match c.wait() {
            Ok(_) if running => say(&format!("rc {name} killed 0")),
            Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(code), _) => say(&format!("rc {name} {code} 0")),
                (None, sig) => say(&format!("rc {name} signal{} 0", sig.unwrap_or(0))),
            },
            Err(e) => say(&format!("rc {name} error wait: {e}")),
        }
        send_file(&name, &format!("/tmp/lab/{name}.stdout"));
        send_file(&name, &format!("/tmp/lab/{name}.stderr"));
    }
    send_dmesg();
    say("done");
    // SAFETY: plain syscalls; the machine powers off.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
}
