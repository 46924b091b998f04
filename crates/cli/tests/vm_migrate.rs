//! Live migration of a VM guest under QEMU (TCG) between two daemons on this host: the VM
//! keeps its QEMU and its ivshmem memory file; the source daemon passes the VM's doorbell
//! connection and memory file to the target, and the guest library inside the VM resumes its
//! session there (and back again) while checking its regions' bytes every 100 ms. Skipped,
//! loudly, only when QEMU is absent (`VIRTSOC_REQUIRE_ALL` makes that a failure).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Instant;

use common::{build_guest_image, free_port, qemu_present, request_migration, Daemon};
use serde_json::Value;

const TOKEN: &str = "vm-migration-token-0123456789abcd";

/// Builds (once per test binary) the guest image holding this build's `virtsoc` (as
/// tests/vm.rs does, in a directory of its own).
fn image() -> &'static PathBuf {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| build_guest_image("vm-image-test-migrate"))
}

/// The id of the guest that resumed a session in `d` (from its log).
fn resumed_guest(d: &Daemon) -> u64 {
    let l = d.expect_log("resumed the session of guest");
    l.split("guest ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no guest id in {l:?}"))
}

/// Two daemons, `a` serving a VM endpoint, `b` (with `b_fault`) none, both accepting
/// migrations; a VM running `virtsoc debug keep` on `a`'s endpoint (calling host services
/// over channels too with `services`), ready.
struct Setup {
    a: Daemon,
    b: Daemon,
    pa: u16,
    pb: u16,
    vm: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    first: u64,
    token_file: PathBuf,
    /// Regions the guest holds: its three, and one per channel.
    regions: u64,
}

fn setup(tag: &str, b_fault: Option<&str>, services: bool) -> Setup {
    let image = image();
    let dir = std::env::temp_dir();
    let tag = format!("{}-{tag}", std::process::id());
    let token_file = dir.join(format!("virtsoc-vmmig-{tag}.token"));
    std::fs::write(&token_file, TOKEN).unwrap();
    let shm = dir.join(format!("virtsoc-vmmig-{tag}.shm"));
    let sock = dir.join(format!("virtsoc-vmmig-{tag}.sock"));
    let (pa, pb) = (free_port(), free_port());
    let spec = format!("vm0:{}:{}:64", shm.display(), sock.display());
    let (la, lb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let tf = token_file.to_str().unwrap();
    let a = Daemon::start(&["--vm", &spec, "--token-file", tf, "--migrate-listen", &la]);
    let mut b_args = vec!["--token-file", tf, "--migrate-listen", &lb];
    if let Some(f) = b_fault {
        b_args.extend(["--migrate-fault", f]);
    }
    let b = Daemon::start(&b_args);
    let mut vm = common::virtsoc_cmd()
        .args(["vm", "run", "--timeout", "300", "--image"])
        .arg(image)
        .arg("--shm")
        .arg(&shm)
        .arg("--doorbell")
        .arg(&sock)
        .args([
            "--",
            "debug",
            "keep",
            "--socket",
            "vm",
            "--regions",
            "3",
            "--size",
            "262144",
            "--seconds",
            "25",
        ])
        .args(services.then_some("--services"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(vm.stdout.take().unwrap());
    let mut line = String::new();
    let first: u64 = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the VM guest never got ready"
        );
        eprint!("[vm] {line}");
        if let Some(id) = line.trim().strip_prefix("READY ") {
            break id.parse().unwrap();
        }
    };
    Setup {
        a,
        b,
        pa,
        pb,
        vm,
        out,
        first,
        token_file,
        regions: 3 + 2 * u64::from(services),
    }
}

impl Setup {
    /// The guest's own verdict: every check of every region found its bytes. Its report.
    fn check_report(self) -> Value {
        let mut report = None;
        for l in self.out.lines().map_while(Result::ok) {
            if l.trim_start().starts_with('{') {
                report = serde_json::from_str::<Value>(l.trim()).ok();
            }
        }
        let mut vm = self.vm;
        let st = vm.wait().unwrap();
        let r = report.expect("the guest's JSON report");
        eprintln!("VM guest report: {r}");
        assert!(st.success(), "{r}");
        assert_eq!(r["bad"], 0, "{r}");
        assert_eq!(r["regions"], self.regions, "{r}");
        // Three regions every 100 ms for 25 s (fewer under a loaded TCG): most came after
        // the moves, which happened within the first seconds.
        assert!(r["checks"].as_u64().unwrap() >= 30, "{r}");
        // Its service calls (if any) all answered right: each bulk transfer counted once.
        assert_eq!(r["service_bad"], 0, "{r}");
        std::fs::remove_file(&self.token_file).ok();
        r
    }
}

/// The guest calls host services over two channels all along (a bulk transfer and a
/// location read every round): its channels follow it there and back.
#[test]
fn a_vm_guest_migrates_there_and_back_with_its_regions() {
    if !qemu_present() {
        return;
    }
    let s = setup("both", None, true);
    // There: the VM's port moves to b, the guest resumes its session there.
    let t = Instant::now();
    let (status, v) = request_migration(&s.a, s.first, &format!("127.0.0.1:{}", s.pb), TOKEN);
    assert_eq!(status, 200, "{v}");
    let second = resumed_guest(&s.b);
    // Welcomed there (its session can move again only once it is a guest of b).
    s.b.expect_log("connected, coherence");
    s.a.expect_log("migration committed");
    eprintln!(
        "VM guest migrated a -> b: {v}, resumed {} ms after the request",
        t.elapsed().as_millis()
    );
    // And back: a takes the port again.
    let t = Instant::now();
    let (status, v) = request_migration(&s.b, second, &format!("127.0.0.1:{}", s.pa), TOKEN);
    assert_eq!(status, 200, "{v}");
    resumed_guest(&s.a);
    s.b.expect_log("migration committed");
    eprintln!(
        "VM guest migrated b -> a: {v}, resumed {} ms after the request",
        t.elapsed().as_millis()
    );
    let r = s.check_report();
    // Calls on the channels before, between and after the moves (two a round).
    assert!(r["service_calls"].as_u64().unwrap() >= 20, "{r}");
}

/// The target dies when the guest said hello to it, after it took the VM's port and
/// restored the session but before it confirmed: the source reads the port again and the
/// guest, getting no answer, says hello again and resumes there.
#[test]
fn a_vm_guest_goes_on_at_its_source_when_the_target_dies_before_confirming() {
    if !qemu_present() {
        return;
    }
    let mut s = setup("fault", Some("resume"), false);
    let (status, v) = request_migration(&s.a, s.first, &format!("127.0.0.1:{}", s.pb), TOKEN);
    assert_eq!(status, 200, "handed over: {v}");
    let st = s.b.child.wait().unwrap();
    assert_eq!(st.code(), Some(86), "the target exited at the fault");
    s.a.expect_log("the guest resumes here");
    resumed_guest(&s.a);
    s.check_report();
}
