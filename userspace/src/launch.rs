//! Starting the command of `etm-bpf run -- CMD [ARGS...]`, held before its `execve`.
//!
//! [`Held::spawn`] forks; the child prepares everything (standard streams, user and groups)
//! and then blocks on a pipe, so the parent can open the perf events and load the eBPF program
//! for the child's pid first. [`Held::release`] lets it `execve` and returns once the exec
//! happened (or says why it failed): not one instruction of the command runs unprofiled.
//!
//! Everything the child needs is built before the fork; between fork and exec the child only
//! makes async-signal-safe system calls (no allocation, no locks).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// The user the command runs as when it is not the current one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the user's groups from the group database, or just `gid`).
    pub groups: Vec<u32>,
    /// Login name and home directory from the password database, if the uid is in it.
    pub name: Option<String>,
    pub home: Option<PathBuf>,
}

impl RunAs {
    /// Under `sudo` as root: the invoking user (`SUDO_UID`, `SUDO_GID`), as `sudo -u` would set
    /// it up (that user's supplementary groups, `HOME`, `USER`, `LOGNAME`). `None` if not root
    /// or not under sudo (or sudo was run by root).
    pub fn from_sudo_env() -> anyhow::Result<Option<RunAs>> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let Some(uid) = std::env::var_os("SUDO_UID") else { return Ok(None) };
        let uid: u32 = uid
            .to_str()
            .and_then(|s| s.trim().parse().ok())
            .with_context(|| format!("SUDO_UID is not a user id: {}", uid.to_string_lossy()))?;
        if uid == 0 {
            return Ok(None);
        }
        let (name, home, pw_gid) = passwd(uid);
        let gid = match std::env::var_os("SUDO_GID") {
            Some(g) => g
                .to_str()
                .and_then(|s| s.trim().parse().ok())
                .with_context(|| format!("SUDO_GID is not a group id: {}", g.to_string_lossy()))?,
            None => {
                pw_gid.with_context(|| format!("SUDO_UID {uid} is set but SUDO_GID is not, and uid {uid} has no passwd entry"))?
            }
        };
        let groups = name.as_deref().map(|n| group_list(n, gid)).unwrap_or_else(|| vec![gid]);
        Ok(Some(RunAs { uid, gid, groups, name, home }))
    }
}

/// Name, home directory and primary group of `uid` from the password database.
fn passwd(uid: u32) -> (Option<String>, Option<PathBuf>, Option<u32>) {
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut res: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf outlives the use of pw's strings below.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut res) };
    if r != 0 || res.is_null() {
        return (None, None, None);
    }
    // SAFETY: on success pw_name and pw_dir point to NUL-terminated strings in buf.
    let (name, dir) = unsafe { (std::ffi::CStr::from_ptr(pw.pw_name), std::ffi::CStr::from_ptr(pw.pw_dir)) };
    (Some(name.to_string_lossy().into_owned()), Some(PathBuf::from(OsStr::from_bytes(dir.to_bytes()))), Some(pw.pw_gid))
}

/// The supplementary groups of user `name` with primary group `gid` (`getgrouplist`).
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else { return vec![gid] };
    let mut n: libc::c_int = 64;
    for _ in 0..4 {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut got = n;
        // SAFETY: groups has room for `got` entries; getgrouplist updates `got`.
        let r = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut got) };
        if r >= 0 {
            groups.truncate(got.max(0) as usize);
            return groups;
        }
        n = got.max(n * 2);
    }
    vec![gid]
}

/// Where the command's standard streams go.
pub enum Stdio {
    /// The terminal's (inherited).
    Inherit,
    /// stdin from /dev/null, stdout and stderr appended to the file.
    File(PathBuf),
}

/// A forked child waiting to exec the command.
pub struct Held {
    pid: u32,
    program: PathBuf,
    /// Write end of the release pipe (one byte releases the child; EOF makes it exit).
    release: Option<OwnedFd>,
    /// Read end of the exec-status pipe (close-on-exec in the child: EOF means exec'd).
    status: OwnedFd,
    reaped: Option<i32>,
}

/// Stage codes the child reports through the status pipe with its errno.
const STAGE_GROUPS: i32 = 1;
const STAGE_GID: i32 = 2;
const STAGE_UID: i32 = 3;
const STAGE_EXEC: i32 = 4;
const STAGE_STDIO: i32 = 5;

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("cannot create a pipe");
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `program` as `execvp` would find it: a path if it contains a slash, else the first
/// executable file of that name in `PATH`.
pub fn find_program(program: &OsStr) -> anyhow::Result<PathBuf> {
    let p = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        if !p.exists() {
            bail!("cannot run {}: no such file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(p);
        if let Ok(m) = cand.metadata()
            && m.is_file()
            && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        {
            return Ok(cand);
        }
    }
    bail!("command not found: {} (not in PATH)", p.display())
}

fn cstring(s: impl Into<Vec<u8>>, what: &str) -> anyhow::Result<CString> {
    CString::new(s).with_context(|| format!("{what} contains a NUL byte"))
}

impl Held {
    /// Forks the child for `argv` (program and arguments), which sets up its streams and
    /// user and waits for [`Held::release`].
    pub fn spawn(argv: &[OsString], run_as: Option<&RunAs>, stdio: &Stdio) -> anyhow::Result<Held> {
        let Some(program) = argv.first() else { bail!("no command given after --") };
        let path = find_program(program)?;
        let c_path = cstring(path.as_os_str().as_bytes(), "the command")?;
        let c_args: Vec<CString> =
            argv.iter().map(|a| cstring(a.clone().into_vec(), "an argument")).collect::<anyhow::Result<_>>()?;
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(u) = run_as {
            let mut set = |k: &str, v: OsString| match env.iter_mut().find(|(n, _)| n == k) {
                Some(e) => e.1 = v,
                None => env.push((k.into(), v)),
            };
            if let Some(n) = &u.name {
                set("USER", n.into());
                set("LOGNAME", n.into());
            }
            if let Some(h) = &u.home {
                set("HOME", h.clone().into_os_string());
            }
        }
        let c_env: Vec<CString> = env
            .into_iter()
            .filter_map(|(k, v)| {
                let mut b = k.into_vec();
                b.push(b'=');
                b.extend(v.into_vec());
                CString::new(b).ok()
            })
            .collect();
        let mut argv_p: Vec<*const libc::c_char> = c_args.iter().map(|c| c.as_ptr()).collect();
        argv_p.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = c_env.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());
        let groups: Vec<libc::gid_t> = run_as.map(|u| u.groups.clone()).unwrap_or_default();
        let files = match stdio {
            Stdio::Inherit => None,
            Stdio::File(p) => {
                let null = File::open("/dev/null").context("cannot open /dev/null")?;
                let out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("cannot open the command's output file {}", p.display()))?;
                Some((OwnedFd::from(null), OwnedFd::from(out)))
            }
        };
        let (release_rd, release_wr) = pipe()?;
        let (status_rd, status_wr) = pipe()?;

        // SAFETY: the child below only makes async-signal-safe calls on data prepared above.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("cannot fork to start the command");
        }
        if pid == 0 {
            // The child.
            let fail = |stage: i32| -> ! {
                let msg = [stage, std::io::Error::last_os_error().raw_os_error().unwrap_or(0)];
                // SAFETY: write of a local buffer to our pipe, then _exit.
                unsafe {
                    libc::write(status_wr.as_raw_fd(), msg.as_ptr().cast(), std::mem::size_of_val(&msg));
                    libc::_exit(127)
                }
            };
            // SAFETY: plain system calls on fds and data owned by this (forked) process.
            unsafe {
                drop(release_wr);
                drop(status_rd);
                if let Some((null, out)) = &files
                    && (libc::dup2(null.as_raw_fd(), 0) < 0
                        || libc::dup2(out.as_raw_fd(), 1) < 0
                        || libc::dup2(out.as_raw_fd(), 2) < 0)
                {
                    fail(STAGE_STDIO);
                }
                if let Some(u) = run_as {
                    if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                        fail(STAGE_GROUPS);
                    }
                    if libc::setgid(u.gid) != 0 {
                        fail(STAGE_GID);
                    }
                    if libc::setuid(u.uid) != 0 {
                        fail(STAGE_UID);
                    }
                }
                // The Rust runtime ignores SIGPIPE; the command gets the default back.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let mut b = 0u8;
                loop {
                    let n = libc::read(release_rd.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                    if n == 1 {
                        break;
                    }
                    if n < 0 && *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    // The profiler went away before releasing us: do not run unprofiled.
                    libc::_exit(127);
                }
                libc::execve(c_path.as_ptr(), argv_p.as_ptr(), envp.as_ptr());
                fail(STAGE_EXEC);
            }
        }
        drop(release_rd);
        drop(status_wr);
        Ok(Held { pid: pid as u32, program: path, release: Some(release_wr), status: status_rd, reaped: None })
    }

    /// The child's pid (the command's, after exec).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exec the command; returns once it did, or the reason it could not.
    pub fn release(&mut self) -> anyhow::Result<()> {
        let Some(fd) = self.release.take() else { return Ok(()) };
        let b = [1u8];
        // SAFETY: write of one byte from a local buffer to our pipe.
        if unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error()).context("cannot release the command");
        }
        drop(fd);
        let mut msg = [0i32; 2];
        let mut got = 0usize;
        let size = std::mem::size_of_val(&msg);
        while got < size {
            // SAFETY: read into the rest of the local buffer.
            let n = unsafe { libc::read(self.status.as_raw_fd(), (msg.as_mut_ptr() as *mut u8).add(got).cast(), size - got) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        if got == 0 {
            return Ok(()); // close-on-exec closed the pipe: the command runs.
        }
        let _ = self.wait();
        let err = std::io::Error::from_raw_os_error(msg[1]);
        let what = match msg[0] {
            STAGE_GROUPS => "cannot set the supplementary groups of the command",
            STAGE_GID => "cannot set the group id of the command",
            STAGE_UID => "cannot set the user id of the command",
            STAGE_STDIO => "cannot redirect the command's standard streams",
            _ => "cannot execute",
        };
        if msg[0] == STAGE_EXEC {
            bail!("cannot execute {}: {err}", self.program.display());
        }
        bail!("{what}: {err}")
    }

    /// The exit status if the child has exited (reaping it), without blocking.
    pub fn try_wait(&mut self) -> Option<i32> {
        if self.reaped.is_none() {
            let mut st = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut st, libc::WNOHANG) };
            if r == self.pid as i32 {
                self.reaped = Some(st);
            }
        }
        self.reaped
    }

    /// Waits for the child to exit; its raw wait status.
    pub fn wait(&mut self) -> std::io::Result<i32> {
        while self.reaped.is_none() {
            let mut st = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut st, 0) };
            if r == self.pid as i32 {
                self.reaped = Some(st);
            } else if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
        Ok(self.reaped.unwrap_or(0))
    }

    /// Sends `sig` to the command (if it has not been reaped).
    pub fn signal(&self, sig: i32) {
        if self.reaped.is_none() {
            // SAFETY: kill on our own, unreaped child's pid.
            unsafe { libc::kill(self.pid as i32, sig) };
        }
    }
}

impl Drop for Held {
    /// A child never released exits on the pipe's EOF; reap it so no zombie stays.
    fn drop(&mut self) {
        if self.release.take().is_some() {
            let _ = self.wait();
        }
    }
}

/// The shell convention for a wait status: the exit code, or 128 + the signal number.
pub fn exit_code(status: i32) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        (128 + libc::WTERMSIG(status)) as u8
    } else {
        1
    }
}

/// How the command ended, as a sentence fragment.
pub fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: strsignal returns a pointer to a static or thread-local string.
        let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }.to_string_lossy().into_owned();
        format!("killed by signal {sig} ({name})")
    } else {
        "ended".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held child runs nothing before release, then exits with the command's status.
    #[test]
    fn held_child_execs_on_release_and_reports_status() {
        let argv: Vec<OsString> = ["sh", "-c", "exit 7"].iter().map(OsString::from).collect();
        let mut h = Held::spawn(&argv, None, &Stdio::Inherit).expect("spawn");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(h.try_wait(), None, "the child waits for release");
        h.release().expect("release");
        let st = h.wait().unwrap();
        assert_eq!(exit_code(st), 7);
        assert_eq!(describe_status(st), "exited with status 7");
    }

    /// Death by a signal is 128 + the signal number.
    #[test]
    fn signal_status_is_128_plus_signal() {
        let argv: Vec<OsString> = ["sh", "-c", "kill -9 $$"].iter().map(OsString::from).collect();
        let mut h = Held::spawn(&argv, None, &Stdio::Inherit).expect("spawn");
        h.release().expect("release");
        assert_eq!(exit_code(h.wait().unwrap()), 137);
    }

    /// A command that is not there is an error sentence before anything is forked, and a
    /// file that cannot be executed is reported by the release.
    #[test]
    fn missing_and_unexecutable_commands() {
        let e = Held::spawn(&[OsString::from("no-such-command-etm-bpf")], None, &Stdio::Inherit).err().unwrap();
        assert_eq!(format!("{e:#}"), "command not found: no-such-command-etm-bpf (not in PATH)");
        let mut h = Held::spawn(&[OsString::from("/proc/version")], None, &Stdio::Inherit).expect("spawn");
        let e = h.release().unwrap_err();
        assert!(format!("{e:#}").starts_with("cannot execute /proc/version: "), "{e:#}");
    }

    /// Never released, the child exits without running the command (and is reaped).
    #[test]
    fn unreleased_child_does_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("ran");
        let argv: Vec<OsString> = vec!["touch".into(), mark.clone().into_os_string()];
        drop(Held::spawn(&argv, None, &Stdio::Inherit).expect("spawn"));
        assert!(!mark.exists());
    }
}
