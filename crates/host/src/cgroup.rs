//! Guests' CPU weight through cgroups (`virtsocd --cpu-cgroup NAME`).
//!
//! A guest's device share says how much of a device it gets; a multimedia guest also needs
//! the CPU to prepare its frames. Where the daemon may, each guest's process (a process
//! guest's peer from `SO_PEERCRED`, a VM's QEMU process, the peer of its virtio-serial
//! socket) goes into a cgroup of its own, `NAME/guest-<id>` under the daemon's own cgroup,
//! whose CPU weight follows the guest's share: the policy's when it connects, the DFR
//! feedback loop's while it runs (`crate::device::feedback`).
//!
//! - **cgroup v2** (production hosts): `cpu.weight` (1..10000, default 100, so a share of
//!   100 is the default weight), the `cpu` controller enabled in the `cgroup.subtree_control`
//!   of the daemon's group and of `NAME`. The daemon's group must be delegated to it
//!   (`Delegate=yes` under systemd) and, by cgroup v2's no-internal-process rule, hold no
//!   process itself once a controller is enabled below it.
//! - **cgroup v1**: the `cpu` hierarchy's `cpu.shares` (2..262144, default 1024: a share of
//!   100 is 1024).
//!
//! The parent's own weight is the sum of its guests' policy weights (at least the default):
//! moving guests into groups of their own must not shrink what they get all together against
//! the host's other processes (under cgroup v1 at the root, every process there weighs as
//! much as the whole group). The feedback loop's raises do not raise it: they move CPU from
//! the other guests to the one behind its frame rate, never from the host's processes, the
//! daemon among them, whose threads do the guests' device work (a CPU-emulated GPU).
//!
//! The daemon's worker processes that serve one guest alone (its GLES render worker) join
//! that guest's group ([`CpuCgroups::attach_worker`]): on a CPU-emulated GPU their CPU is
//! the guest's device time, and it weighs the guest's share like the guest's own.
//!
//! When the guest leaves, its process (if still alive) goes back to the cgroup it came from
//! and the group is removed; the daemon's exit removes `NAME` too. Anything that cannot be
//! done (no cpu controller, no permission, a guest sharing the daemon's process or another
//! guest's) is logged and leaves that guest's CPU weight alone: device sharing goes on.
//!
//! A guest cannot choose what is moved: the pid comes from the kernel, not from the guest.
//! It could, though, exit right after connecting and its pid be reused by another process
//! before the move (the window is the handshake); the weight is then another process's
//! until the guest's session ends. Every file access goes through [`CgroupFs`], so the
//! tests run against a fake tree in a temporary directory.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use virtsoc_svm::GuestId;
use virtsoc_sync::LockExt;

use crate::{HostError, Result};

/// The share whose weight is the interface's default.
const DEFAULT_CPU_SHARE: u32 = 100;

/// The file operations the cgroup code needs (the real file system, or a fake tree).
pub trait CgroupFs: Send + Sync {
    /// The contents of a control file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes `text` to a control file.
    fn write(&self, path: &Path, text: &str) -> io::Result<()>;
    /// Creates a cgroup directory.
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Removes a cgroup directory (on cgroupfs its control files go with it).
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Whether the file or directory exists.
    fn exists(&self, path: &Path) -> bool;
    /// The names of a directory's entries.
    fn list(&self, path: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }
}

/// The host's file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl CgroupFs for RealFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&self, path: &Path, text: &str) -> io::Result<()> {
        std::fs::write(path, text)
    }
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// Which cgroup interface carries the CPU weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// cgroup v2, `cpu.weight`.
    V2,
    /// cgroup v1, `cpu.shares`.
    V1,
}

impl Version {
    /// The weight file.
    pub fn file(self) -> &'static str {
        match self {
            Version::V2 => "cpu.weight",
            Version::V1 => "cpu.shares",
        }
    }

    /// The weight for a share (100, the default share, is the interface's default weight).
    pub fn weight_of(self, share: u32) -> u64 {
        match self {
            Version::V2 => u64::from(share).clamp(1, 10_000),
            Version::V1 => (u64::from(share) * 1024 / 100).clamp(2, 262_144),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V2 => "cgroup v2 cpu.weight",
            Version::V1 => "cgroup v1 cpu.shares",
        })
    }
}

/// One guest in its group.
#[derive(Debug)]
struct Member {
    /// The guest's name (its policy entry).
    name: String,
    dir: PathBuf,
    pid: u32,
    /// The cgroup the process was in before.
    origin: PathBuf,
    weight: u64,
    /// Its weight from the policy share it connected with.
    base: u64,
    /// The daemon's worker processes serving this guest alone (its render worker, its
    /// decoders'), in its group too ([`CpuCgroups::attach_worker`]).
    workers: Vec<u32>,
}

/// The per-guest CPU cgroups under one parent.
pub struct CpuCgroups {
    fs: Box<dyn CgroupFs>,
    version: Version,
    proc_root: PathBuf,
    /// Where the hierarchy is mounted.
    mount: PathBuf,
    parent: PathBuf,
    /// The daemon's own pid (never moved).
    own_pid: u32,
    members: Mutex<HashMap<GuestId, Member>>,
    /// The daemon's device threads' group, once made ([`CpuCgroups::attach_device_threads`]).
    device: Mutex<Option<DeviceThreads>>,
}

/// The daemon's threads doing a CPU-emulated device's work (a CPU Vulkan driver's
/// rasterizer threads), in a group of their own beside the guests'.
#[derive(Debug)]
struct DeviceThreads {
    dir: PathBuf,
    /// Where the threads were (the daemon's group).
    origin: PathBuf,
    tids: Vec<u32>,
    /// The weight of the threads' own nice value: what they weighed before the move.
    base: u64,
    weight: u64,
}

impl fmt::Debug for CpuCgroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuCgroups")
            .field("version", &self.version)
            .field("parent", &self.parent)
            .finish_non_exhaustive()
    }
}

fn config(msg: String) -> HostError {
    HostError::Config(msg)
}

/// The path of the hierarchy `version` in a `/proc/PID/cgroup` text (relative, no leading
/// `/`).
fn group_in(text: &str, version: Version) -> Option<String> {
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (id, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let ours = match version {
            Version::V2 => id == "0" && ctrls.is_empty(),
            Version::V1 => ctrls.split(',').any(|c| c == "cpu"),
        };
        ours.then(|| path.trim_start_matches('/').to_string())
    })
}

impl CpuCgroups {
    /// Finds the cpu controller on this host and makes `parent` (a plain name) under the
    /// daemon's own cgroup.
    pub fn detect(parent: &str) -> Result<Self> {
        Self::detect_in(
            Box::new(RealFs),
            Path::new("/sys/fs/cgroup"),
            Path::new("/proc"),
            std::process::id(),
            parent,
        )
    }

    /// [`detect`](Self::detect) with cgroupfs at `root`, procfs at `proc_root` and the daemon
    /// as `own_pid`.
    pub fn detect_in(
        fs: Box<dyn CgroupFs>,
        root: &Path,
        proc_root: &Path,
        own_pid: u32,
        parent: &str,
    ) -> Result<Self> {
        if parent.is_empty() || parent.contains('/') || parent.starts_with('.') || parent.len() > 64
        {
            return Err(config(format!(
                "cpu cgroup name {parent:?}: want a plain directory name"
            )));
        }
        let v2 = [root.to_path_buf(), root.join("unified")]
            .into_iter()
            .find(|m| {
                fs.read(&m.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"))
            });
        let v1 = [root.join("cpu"), root.join("cpu,cpuacct")]
            .into_iter()
            .find(|m| fs.exists(&m.join("cpu.shares")));
        let (version, mount) = match (v2, v1) {
            (Some(m), _) => (Version::V2, m),
            (None, Some(m)) => (Version::V1, m),
            (None, None) => {
                return Err(config(format!(
                    "no cpu controller under {}: neither cgroup v2 with cpu in \
                     cgroup.controllers nor cgroup v1 cpu.shares",
                    root.display()
                )))
            }
        };
        let own = fs
            .read(&proc_root.join(own_pid.to_string()).join("cgroup"))
            .map_err(|e| config(format!("cannot read the daemon's cgroup: {e}")))?;
        let group = group_in(&own, version).ok_or_else(|| {
            config(format!(
                "the daemon's {version} group is not in /proc/self/cgroup"
            ))
        })?;
        let base = mount.join(&group);
        let dir = base.join(parent);
        let why = |what: &str, e: io::Error| {
            config(format!(
                "{version}: cannot {what}: {e} (no permission or no delegation?)"
            ))
        };
        if version == Version::V2 {
            enable_cpu(fs.as_ref(), &base)
                .map_err(|e| why("enable cpu below the daemon's group", e))?;
        }
        match fs.mkdir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(why(&format!("create {}", dir.display()), e)),
        }
        if version == Version::V2 {
            enable_cpu(fs.as_ref(), &dir).map_err(|e| why("enable cpu in its group", e))?;
        }
        Ok(CpuCgroups {
            fs,
            version,
            proc_root: proc_root.to_path_buf(),
            mount,
            parent: dir,
            own_pid,
            members: Mutex::new(HashMap::new()),
            device: Mutex::new(None),
        })
    }

    /// The interface in use.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The parent group's directory.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// The directory `guest`'s group has (or would have).
    pub fn dir_of(&self, guest: GuestId) -> PathBuf {
        self.parent.join(format!("guest-{guest}"))
    }

    /// The weight `guest`'s group has, if it has one.
    pub fn weight(&self, guest: GuestId) -> Option<u64> {
        self.lock().get(&guest).map(|m| m.weight)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GuestId, Member>> {
        self.members.lock_or_recover()
    }

    /// Puts process `pid` of `guest` (named `name`, as the policy knows it) into a group of
    /// its own with the weight of `share`.
    pub fn attach(&self, guest: GuestId, name: &str, pid: u32, share: u32) -> Result<()> {
        if pid == 0 || pid == self.own_pid {
            return Err(config(format!(
                "guest {guest} runs in the daemon's own process: its CPU weight is the daemon's"
            )));
        }
        let mut members = self.lock();
        if let Some((g, _)) = members.iter().find(|(_, m)| m.pid == pid) {
            return Err(config(format!(
                "guest {guest} shares process {pid} with guest {g}: its CPU weight is that group's"
            )));
        }
        let proc_cgroup = self.proc_root.join(pid.to_string()).join("cgroup");
        let text = self
            .fs
            .read(&proc_cgroup)
            .map_err(|e| config(format!("guest {guest}: process {pid}: {e}")))?;
        let origin_rel = group_in(&text, self.version).ok_or_else(|| {
            config(format!(
                "guest {guest}: process {pid} has no {} group",
                self.version
            ))
        })?;
        let origin = self.mount.join(origin_rel);
        let dir = self.dir_of(guest);
        match self.fs.mkdir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(config(format!("cannot create {}: {e}", dir.display()))),
        }
        let weight = self.version.weight_of(share);
        let placed = self
            .fs
            .write(&dir.join(self.version.file()), &weight.to_string())
            .and_then(|()| self.fs.write(&dir.join("cgroup.procs"), &pid.to_string()));
        if let Err(e) = placed {
            let _ = self.fs.rmdir(&dir);
            return Err(config(format!(
                "guest {guest}: cannot place process {pid} in {}: {e}",
                dir.display()
            )));
        }
        members.insert(
            guest,
            Member {
                name: name.to_string(),
                dir,
                pid,
                origin,
                weight,
                base: weight,
                workers: Vec::new(),
            },
        );
        self.sync_parent(&members);
        Ok(())
    }

    /// Puts `pid`, a worker process of the daemon that serves `guest` alone (its GLES render
    /// worker, a decoder's worker), into the guest's group, so the CPU it burns for the
    /// guest weighs what the guest's share says (and follows the feedback loop's raises):
    /// on a CPU-emulated GPU or a software decoder, that CPU is the device. `Ok(false)`
    /// when the guest has no group (its worker stays in the daemon's). When the guest
    /// leaves, live workers go back to the daemon's group before its group is removed.
    pub fn attach_worker(&self, guest: GuestId, pid: u32) -> Result<bool> {
        if pid == 0 || pid == self.own_pid {
            return Err(config(format!(
                "guest {guest}: the daemon's own process is not a worker"
            )));
        }
        let mut members = self.lock();
        let Some(m) = members.get_mut(&guest) else {
            return Ok(false);
        };
        self.fs
            .write(&m.dir.join("cgroup.procs"), &pid.to_string())
            .map_err(|e| {
                config(format!(
                    "guest {guest}: cannot place worker {pid} in {}: {e}",
                    m.dir.display()
                ))
            })?;
        // Workers that ended are forgotten as new ones come (pids are not reused while
        // the daemon has not reaped them, and it reaps its workers when they end).
        let proc_root = &self.proc_root;
        m.workers
            .retain(|w| *w != pid && self.fs.exists(&proc_root.join(w.to_string())));
        m.workers.push(pid);
        Ok(true)
    }

    /// The parent's weight: its guests' policy weights together.
    fn sync_parent(&self, members: &HashMap<GuestId, Member>) {
        let device = self.device.lock_or_recover().as_ref().map_or(0, |d| d.base);
        let sum: u64 = members.values().map(|m| m.base).sum::<u64>() + device;
        let default = self.version.weight_of(DEFAULT_CPU_SHARE);
        let max = self.version.weight_of(u32::MAX);
        let w = sum.clamp(default, max);
        if let Err(e) = self
            .fs
            .write(&self.parent.join(self.version.file()), &w.to_string())
        {
            log::warn!(
                "cpu weight: cannot set {}'s weight: {e}",
                self.parent.display()
            );
        }
    }

    /// Sets `guest`'s weight from `share` (nothing if it has no group).
    pub fn set_share(&self, guest: GuestId, share: u32) -> Result<()> {
        let mut members = self.lock();
        let Some(m) = members.get_mut(&guest) else {
            return Ok(());
        };
        let weight = self.version.weight_of(share);
        if weight == m.weight {
            return Ok(());
        }
        self.fs
            .write(&m.dir.join(self.version.file()), &weight.to_string())
            .map_err(|e| config(format!("guest {guest}: cannot set its weight: {e}")))?;
        m.weight = weight;
        Ok(())
    }

    /// The policy changed (a reload, SIGHUP or the control API): every guest's policy weight
    /// becomes that of `share_of(its name)`, and so does its weight unless the feedback loop
    /// has moved it from the old policy weight (the loop re-applies its own share every
    /// period, and restores the policy's when the guest idles); the parent's weight follows.
    pub fn reweight(&self, share_of: &dyn Fn(&str) -> u32) {
        let mut members = self.lock();
        for (guest, m) in members.iter_mut() {
            let base = self.version.weight_of(share_of(&m.name));
            if base == m.base {
                continue;
            }
            if m.weight == m.base {
                match self
                    .fs
                    .write(&m.dir.join(self.version.file()), &base.to_string())
                {
                    Ok(()) => m.weight = base,
                    Err(e) => log::warn!("cpu weight: guest {guest}: cannot set its weight: {e}"),
                }
            }
            m.base = base;
        }
        self.sync_parent(&members);
    }

    /// Moves the daemon's threads `tids` (a CPU Vulkan driver's worker threads, which run
    /// every guest's GPU work: [`crate::device::Device::cpu_threads`]) into a group of their
    /// own, `NAME/device`, beside the guests'. Its weight is at first what the threads
    /// weighed by their nice value (`virtsocd --gpu-driver-nice`: 3, the default, weighs about
    /// half a default process, 10 about a tenth), so nothing changes until the feedback loop raises it
    /// ([`set_device_share`](Self::set_device_share)) for a multimedia guest behind its frame
    /// rate, whose frames that work makes. Returns how many threads were moved (none: no
    /// group). cgroup v1 only: under v2, threads can only be placed in a threaded subtree,
    /// which the daemon's group is not.
    pub fn attach_device_threads(&self, tids: &[u32]) -> Result<usize> {
        if self.version != Version::V1 {
            return Err(config(
                "device threads: cgroup v2 places threads only in a threaded subtree; \
                 their weight stays their nice value's"
                    .into(),
            ));
        }
        let mut slot = self.device.lock_or_recover();
        if slot.is_some() {
            return Ok(0);
        }
        let own = self.proc_root.join(self.own_pid.to_string());
        let text = self
            .fs
            .read(&own.join("cgroup"))
            .map_err(|e| config(format!("device threads: {e}")))?;
        let origin = self
            .mount
            .join(group_in(&text, self.version).unwrap_or_default());
        let mut found = Vec::new();
        let tasks = own.join("task");
        for tid in self.fs.list(&tasks).unwrap_or_default() {
            let Ok(t) = tid.parse::<u32>() else { continue };
            if !tids.contains(&t) {
                continue;
            }
            let nice = self
                .fs
                .read(&tasks.join(&tid).join("stat"))
                .ok()
                .and_then(|s| nice_in_stat(&s))
                .unwrap_or(0);
            found.push((t, nice));
        }
        if found.is_empty() {
            return Ok(0);
        }
        // What the threads weighed together against a default process, by their nice.
        let nice_weight: u64 = found.iter().map(|(_, n)| nice_to_weight(*n)).sum();
        let share = (nice_weight * u64::from(DEFAULT_CPU_SHARE) / 1024).max(1) as u32;
        let base = self.version.weight_of(share);
        let dir = self.parent.join("device");
        match self.fs.mkdir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(config(format!("cannot create {}: {e}", dir.display()))),
        }
        self.fs
            .write(&dir.join(self.version.file()), &base.to_string())
            .map_err(|e| config(format!("device threads: cannot set the weight: {e}")))?;
        let mut tids = Vec::new();
        for (t, _) in &found {
            match self.fs.write(&dir.join("tasks"), &t.to_string()) {
                Ok(()) => tids.push(*t),
                Err(e) => log::warn!("device threads: cannot move thread {t}: {e}"),
            }
        }
        *slot = Some(DeviceThreads {
            dir,
            origin,
            tids,
            base,
            weight: base,
        });
        let n = slot.as_ref().map_or(0, |d| d.tids.len());
        drop(slot);
        self.sync_parent(&self.lock());
        Ok(n)
    }

    /// Sets the device threads' weight from `share`, or back to their own (`None`).
    pub fn set_device_share(&self, share: Option<u32>) -> Result<()> {
        let mut slot = self.device.lock_or_recover();
        let Some(d) = slot.as_mut() else {
            return Ok(());
        };
        let weight = share.map_or(d.base, |s| self.version.weight_of(s).max(d.base));
        if weight == d.weight {
            return Ok(());
        }
        self.fs
            .write(&d.dir.join(self.version.file()), &weight.to_string())
            .map_err(|e| config(format!("device threads: cannot set the weight: {e}")))?;
        d.weight = weight;
        Ok(())
    }

    /// The device threads' group's weight, if they have one.
    pub fn device_weight(&self) -> Option<u64> {
        self.device.lock_or_recover().as_ref().map(|d| d.weight)
    }

    /// `guest` left: its process (if alive) back where it came from, its group removed.
    pub fn detach(&self, guest: GuestId) -> Result<()> {
        let mut members = self.lock();
        let Some(m) = members.remove(&guest) else {
            return Ok(());
        };
        self.sync_parent(&members);
        drop(members);
        self.release(guest, &m)
    }

    fn release(&self, guest: GuestId, m: &Member) -> Result<()> {
        if self.fs.exists(&self.proc_root.join(m.pid.to_string())) {
            // The process may have exited meanwhile (ESRCH): nothing to move then.
            let _ = self
                .fs
                .write(&m.origin.join("cgroup.procs"), &m.pid.to_string());
        }
        // The daemon's workers it still has: back to the daemon's own group (the parent's).
        if let Some(daemon) = self.parent.parent() {
            for w in &m.workers {
                if self.fs.exists(&self.proc_root.join(w.to_string())) {
                    let _ = self.fs.write(&daemon.join("cgroup.procs"), &w.to_string());
                }
            }
        }
        self.fs.rmdir(&m.dir).map_err(|e| {
            config(format!(
                "guest {guest}: cannot remove {}: {e}",
                m.dir.display()
            ))
        })
    }
}

impl CpuCgroups {
    /// Every guest's process back where it came from, every group and the parent removed
    /// (the daemon's exit; also on drop).
    pub fn release_all(&self) {
        let members: Vec<(GuestId, Member)> = self.lock().drain().collect();
        for (g, m) in members {
            if let Err(e) = self.release(g, &m) {
                log::warn!("cpu weight: {e}");
            }
        }
        let device = self.device.lock_or_recover().take();
        if let Some(d) = device {
            for t in &d.tids {
                // A thread that ended meanwhile (ESRCH) has nothing to move.
                let _ = self.fs.write(&d.origin.join("tasks"), &t.to_string());
            }
            if let Err(e) = self.fs.rmdir(&d.dir) {
                log::warn!("cpu weight: cannot remove {}: {e}", d.dir.display());
            }
        }
        if self.fs.exists(&self.parent) {
            if let Err(e) = self.fs.rmdir(&self.parent) {
                log::warn!("cpu weight: cannot remove {}: {e}", self.parent.display());
            }
        }
    }
}

impl Drop for CpuCgroups {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// The nice value in a `/proc/PID/task/TID/stat` text (its 19th field; the command name,
/// the second, is in parentheses and may hold spaces).
fn nice_in_stat(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// The scheduler's weight of a nice value (the kernel's `sched_prio_to_weight`; nice 0 is
/// 1024, each step about 1.25 times).
fn nice_to_weight(nice: i32) -> u64 {
    const W: [u64; 40] = [
        88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100,
        4904, 3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172,
        137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
    ];
    W[(nice.clamp(-20, 19) + 20) as usize]
}

/// Enables the cpu controller for the children of the v2 group `dir`.
fn enable_cpu(fs: &dyn CgroupFs, dir: &Path) -> io::Result<()> {
    let path = dir.join("cgroup.subtree_control");
    if fs
        .read(&path)
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"))
    {
        return Ok(());
    }
    fs.write(&path, "+cpu")
}

/// The pid of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and the descriptor is
    // the stream's own, open while `stream` is borrowed.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
