//! The cgroup code against fake cgroup trees in temporary directories.

use super::*;

/// A fake tree: plain files and directories; removing a group removes its files (as
/// cgroupfs does).
struct Tree;

impl CgroupFs for Tree {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&self, path: &Path, text: &str) -> io::Result<()> {
        if !path.parent().is_some_and(Path::exists) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        std::fs::write(path, text)
    }
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("virtsoc-cgroup-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sys")).unwrap();
        std::fs::create_dir_all(root.join("proc")).unwrap();
        Fixture { root }
    }
    fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }
    fn file(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap_or_default()
    }
    fn has(&self, rel: &str) -> bool {
        self.root.join(rel).exists()
    }
    fn process(&self, pid: u32, cgroup: &str) {
        self.file(&format!("proc/{pid}/cgroup"), cgroup);
    }
    fn detect(&self, own: u32) -> Result<CpuCgroups> {
        CpuCgroups::detect_in(
            Box::new(Tree),
            &self.sys(),
            &self.root.join("proc"),
            own,
            "virtsoc",
        )
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A v1 host like the development machine: `cpu` mounted on its own, the daemon at its root.
fn v1(tag: &str) -> Fixture {
    let f = Fixture::new(tag);
    f.file("sys/cpu/cpu.shares", "1024\n");
    f.file("sys/cpu/user/x/cpu.shares", "1024\n");
    f.file("sys/unified/cgroup.controllers", "\n");
    f.process(100, "9:name=systemd:/\n2:cpuacct:/\n1:cpu:/\n0::/\n");
    f.process(200, "2:cpuacct:/\n1:cpu,cpuacct:/user/x\n0::/\n");
    f
}

#[test]
fn weights_follow_shares_within_each_interface() {
    assert_eq!(Version::V2.weight_of(100), 100);
    assert_eq!(Version::V2.weight_of(0), 1);
    assert_eq!(Version::V2.weight_of(50_000), 10_000);
    assert_eq!(Version::V1.weight_of(100), 1024);
    assert_eq!(Version::V1.weight_of(300), 3072);
    assert_eq!(Version::V1.weight_of(0), 2);
    assert_eq!(Version::V1.weight_of(u32::MAX), 262_144);
}

#[test]
fn v1_guest_is_placed_steered_and_put_back() {
    let f = v1("v1-1");
    let cg = f.detect(100).unwrap();
    assert_eq!(cg.version(), Version::V1);
    assert!(f.has("sys/cpu/virtsoc"));
    cg.attach(GuestId(7), "g", 200, 300).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cpu.shares"), "3072");
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cgroup.procs"), "200");
    assert_eq!(cg.weight(GuestId(7)), Some(3072));
    assert_eq!(
        f.read("sys/cpu/virtsoc/cpu.shares"),
        "3072",
        "the parent weighs its guests"
    );
    cg.set_share(GuestId(7), 50).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cpu.shares"), "512");
    // The feedback loop moves CPU between guests, not from the host: the parent stays.
    cg.set_share(GuestId(7), 1000).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cpu.shares"), "10240");
    assert_eq!(f.read("sys/cpu/virtsoc/cpu.shares"), "3072");
    // A guest without a group: nothing to steer, no error.
    cg.set_share(GuestId(8), 500).unwrap();
    cg.detach(GuestId(7)).unwrap();
    assert_eq!(f.read("sys/cpu/user/x/cgroup.procs"), "200");
    assert!(!f.has("sys/cpu/virtsoc/guest-7"));
    assert_eq!(cg.weight(GuestId(7)), None);
    drop(cg);
    assert!(!f.has("sys/cpu/virtsoc"), "the parent goes with the daemon");
}

/// A guest's worker processes (its render worker, its decoders') go into its group, so
/// their CPU weighs the guest's share; a guest without a group leaves them where they are;
/// when the guest leaves, a worker still alive goes back to the daemon's group.
#[test]
fn a_guests_workers_join_its_group_and_go_back_to_the_daemons() {
    let f = v1("v1-workers");
    f.file("sys/cpu/cgroup.procs", "");
    f.process(300, "1:cpu:/\n");
    f.process(301, "1:cpu:/\n");
    let cg = f.detect(100).unwrap();
    cg.attach(GuestId(7), "g", 200, 300).unwrap();
    assert!(cg.attach_worker(GuestId(7), 300).unwrap());
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cgroup.procs"), "300");
    assert!(
        !cg.attach_worker(GuestId(9), 301).unwrap(),
        "no group: stays"
    );
    assert!(
        cg.attach_worker(GuestId(7), 100).is_err(),
        "never the daemon"
    );
    cg.detach(GuestId(7)).unwrap();
    assert_eq!(
        f.read("sys/cpu/cgroup.procs"),
        "300",
        "back to the daemon's"
    );
    assert_eq!(f.read("sys/cpu/user/x/cgroup.procs"), "200");
    assert!(!f.has("sys/cpu/virtsoc/guest-7"));
}

#[test]
fn v2_enables_the_controller_and_writes_cpu_weight() {
    let f = Fixture::new("v2");
    f.file("sys/cgroup.controllers", "cpuset cpu io memory pids\n");
    f.file(
        "sys/system.slice/virtsocd.service/cgroup.subtree_control",
        "\n",
    );
    f.file("sys/user.slice/app/cgroup.procs", "");
    f.process(100, "0::/system.slice/virtsocd.service\n");
    f.process(300, "0::/user.slice/app\n");
    let cg = f.detect(100).unwrap();
    assert_eq!(cg.version(), Version::V2);
    let daemon = "sys/system.slice/virtsocd.service";
    assert_eq!(f.read(&format!("{daemon}/cgroup.subtree_control")), "+cpu");
    assert_eq!(
        f.read(&format!("{daemon}/virtsoc/cgroup.subtree_control")),
        "+cpu"
    );
    cg.attach(GuestId(3), "g", 300, 250).unwrap();
    assert_eq!(
        f.read(&format!("{daemon}/virtsoc/guest-3/cpu.weight")),
        "250"
    );
    assert_eq!(
        f.read(&format!("{daemon}/virtsoc/guest-3/cgroup.procs")),
        "300"
    );
    // The process exited before its guest's session ended: only the group goes.
    std::fs::remove_dir_all(f.root.join("proc/300")).unwrap();
    cg.detach(GuestId(3)).unwrap();
    assert_eq!(f.read("sys/user.slice/app/cgroup.procs"), "");
    assert!(!f.has(&format!("{daemon}/virtsoc/guest-3")));
}

#[test]
fn no_cpu_controller_is_a_clear_error() {
    let f = Fixture::new("none");
    f.file("sys/unified/cgroup.controllers", "memory pids\n");
    f.file("sys/memory/memory.limit_in_bytes", "0\n");
    f.process(100, "0::/\n");
    let e = f.detect(100).unwrap_err().to_string();
    assert!(e.contains("no cpu controller"), "{e}");
}

#[test]
fn no_permission_is_a_clear_error() {
    let f = Fixture::new("perm");
    f.file("sys/cgroup.controllers", "cpu\n");
    f.process(100, "0::/missing/group\n");
    // The daemon's group does not exist: enabling cpu below it fails.
    let e = f.detect(100).unwrap_err().to_string();
    assert!(e.contains("cannot enable cpu"), "{e}");
}

#[test]
fn the_daemon_and_shared_processes_are_never_moved() {
    let f = v1("v1-2");
    f.process(201, "1:cpu:/\n");
    let cg = f.detect(100).unwrap();
    let e = cg
        .attach(GuestId(1), "g", 100, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("daemon's own process"), "{e}");
    assert!(!f.has("sys/cpu/virtsoc/guest-1"));
    cg.attach(GuestId(2), "g", 200, 50).unwrap();
    assert_eq!(
        f.read("sys/cpu/virtsoc/cpu.shares"),
        "1024",
        "never under the default"
    );
    let e = cg
        .attach(GuestId(3), "g", 200, 400)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shares process 200"), "{e}");
    assert!(!f.has("sys/cpu/virtsoc/guest-3"));
    assert_eq!(f.read("sys/cpu/virtsoc/guest-2/cpu.shares"), "512");
    // A process whose cgroup cannot be read is refused before anything is created.
    assert!(cg.attach(GuestId(4), "g", 999, 100).is_err());
    assert!(!f.has("sys/cpu/virtsoc/guest-4"));
    cg.attach(GuestId(5), "g", 201, 100).unwrap();
}

#[test]
fn bad_parent_names_are_refused() {
    let f = v1("v1-3");
    for bad in ["", "../x", "a/b", ".hidden"] {
        let r = CpuCgroups::detect_in(Box::new(Tree), &f.sys(), &f.root.join("proc"), 100, bad);
        assert!(r.is_err(), "{bad:?}");
    }
}

#[test]
fn a_policy_change_reweights_guests_and_the_parent() {
    let f = v1("reweight");
    f.process(201, "1:cpu:/user/x\n");
    let cg = f.detect(100).unwrap();
    cg.attach(GuestId(7), "video", 200, 100).unwrap();
    cg.attach(GuestId(8), "batch", 201, 100).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/cpu.shares"), "2048");
    // The feedback loop has raised the batch guest (say): that weight is the loop's.
    cg.set_share(GuestId(8), 400).unwrap();
    let share_of = |name: &str| if name == "video" { 300 } else { 50 };
    cg.reweight(&share_of);
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cpu.shares"), "3072");
    assert_eq!(cg.weight(GuestId(7)), Some(3072));
    assert_eq!(
        f.read("sys/cpu/virtsoc/guest-8/cpu.shares"),
        "4096",
        "a weight the feedback loop set stays the loop's"
    );
    assert_eq!(
        f.read("sys/cpu/virtsoc/cpu.shares"),
        "3584",
        "the parent weighs the new policy weights: 3072 + 512"
    );
    // The same policy again writes nothing new.
    cg.reweight(&share_of);
    assert_eq!(f.read("sys/cpu/virtsoc/guest-7/cpu.shares"), "3072");
}

/// A `/proc/PID/task/TID/stat` line with nice `nice` (the 19th field).
fn stat(tid: u32, comm: &str, nice: i32) -> String {
    format!(
        "{tid} ({comm}) S 1 1 1 0 -1 4194560 10 0 0 0 5 3 0 0 {} {nice} 4 0 1000 0 0\n",
        20 + nice
    )
}

#[test]
fn nice_values_and_their_weights() {
    assert_eq!(nice_in_stat(&stat(5, "a (b) c", 10)), Some(10));
    assert_eq!(nice_in_stat(&stat(5, "x", -3)), Some(-3));
    assert_eq!(nice_in_stat("garbage"), None);
    assert_eq!(nice_to_weight(0), 1024);
    assert_eq!(nice_to_weight(10), 110);
    assert_eq!(nice_to_weight(-20), 88761);
    assert_eq!(nice_to_weight(99), 15);
}

#[test]
fn device_threads_get_a_group_the_feedback_loop_can_raise() {
    let f = v1("device");
    for (tid, comm, nice) in [
        (101, "llvmpipe-0", 10),
        (102, "llvmpipe-1", 10),
        (103, "gpu", 0),
    ] {
        f.file(&format!("proc/100/task/{tid}/comm"), &format!("{comm}\n"));
        f.file(&format!("proc/100/task/{tid}/stat"), &stat(tid, comm, nice));
    }
    let cg = f.detect(100).unwrap();
    assert_eq!(cg.device_weight(), None);
    assert_eq!(
        cg.set_device_share(Some(500)).ok(),
        Some(()),
        "no group: nothing"
    );
    assert_eq!(cg.attach_device_threads(&[101, 102]).unwrap(), 2);
    // Two threads at nice 10 weigh 220 of a default process's 1024: share 21.
    assert_eq!(f.read("sys/cpu/virtsoc/device/cpu.shares"), "215");
    assert_eq!(cg.device_weight(), Some(215));
    assert_eq!(
        f.read("sys/cpu/virtsoc/cpu.shares"),
        "1024",
        "at least the default"
    );
    cg.attach(GuestId(7), "video", 200, 100).unwrap();
    assert_eq!(
        f.read("sys/cpu/virtsoc/cpu.shares"),
        "1239",
        "the parent weighs the device threads as they weighed before: 1024 + 215"
    );
    // Once made, not again.
    assert_eq!(cg.attach_device_threads(&[101, 102]).unwrap(), 0);
    cg.set_device_share(Some(1000)).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/device/cpu.shares"), "10240");
    // Never below their own weight; back to it with None.
    cg.set_device_share(Some(1)).unwrap();
    assert_eq!(cg.device_weight(), Some(215));
    cg.set_device_share(Some(1000)).unwrap();
    cg.set_device_share(None).unwrap();
    assert_eq!(f.read("sys/cpu/virtsoc/device/cpu.shares"), "215");
    cg.release_all();
    assert!(!f.has("sys/cpu/virtsoc"));
    let back = f.read("sys/cpu/tasks");
    assert!(
        back == "101" || back == "102",
        "the threads went back: {back}"
    );
}

#[test]
fn device_threads_are_not_moved_under_v2() {
    let f = Fixture::new("device-v2");
    f.file("sys/cgroup.controllers", "cpu io memory\n");
    f.file("sys/daemon.service/cgroup.subtree_control", "\n");
    f.process(100, "0::/daemon.service\n");
    let cg = f.detect(100).unwrap();
    assert_eq!(cg.version(), Version::V2);
    assert!(cg.attach_device_threads(&[101, 102]).is_err());
    assert_eq!(cg.device_weight(), None);
}
