//! A model-based test of credits and fences: random programs of device commands, fence waits
//! and fence signals, with rings far smaller than the programs, run against a real daemon and
//! checked against a model of in-order device queues.
//!
//! The model says, for each program, which fences fire and which commands complete before the
//! guest's CPU signals anything. The daemon must deliver exactly that (liveness: nothing the
//! model completes may hang behind credits, parked commands or full rings; safety: a fence the
//! model leaves unsignaled is not signaled). Then the CPU signals the remaining root fences and
//! everything must complete. Programs are acyclic by construction (a device signals a fence
//! only with a higher index than every fence it waited on before), so every valid program
//! terminates; a session that hangs is the daemon's fault.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Daemon;
use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId, Fence, Opcode};

/// Fences per program.
const FENCES: usize = 6;
/// Operations per program: several times the rings' 16 entries.
const OPS: usize = 120;
/// The devices the programs queue on (two checksum devices reading one region).
const DEVICES: [DeviceId; 2] = [DeviceId::CONSUMER, DeviceId::CONSUMER2];

#[derive(Clone, Copy, Debug)]
enum Op {
    /// A checksum command on device `d`.
    Cmd(usize),
    /// Device `d` waits for fence `f`.
    Wait(usize, usize),
    /// Device `d` signals fence `f` once everything before it ran.
    Signal(usize, usize),
}

/// xorshift64*: a seeded generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// A random acyclic program: each fence is signaled by at most one device signal, placed only
/// where the device waited on lower-numbered fences alone; fences no device signals are the
/// roots the CPU signals at the end.
fn program(seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut max_wait = [None::<usize>; DEVICES.len()];
    let mut signaled = [false; FENCES];
    (0..OPS)
        .map(|_| {
            let d = rng.below(DEVICES.len());
            let f = rng.below(FENCES);
            match rng.below(10) {
                0..=1 => {
                    max_wait[d] = max_wait[d].max(Some(f));
                    Op::Wait(d, f)
                }
                2 if !signaled[f] && max_wait[d].is_none_or(|w| w < f) => {
                    signaled[f] = true;
                    Op::Signal(d, f)
                }
                _ => Op::Cmd(d),
            }
        })
        .collect()
}

/// In-order device queues with no CPU signal: which commands (by index in the program) and
/// which fences complete.
fn model(prog: &[Op]) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let queues: Vec<Vec<usize>> = (0..DEVICES.len())
        .map(|d| {
            (0..prog.len())
                .filter(|&i| match prog[i] {
                    Op::Cmd(x) | Op::Wait(x, _) | Op::Signal(x, _) => x == d,
                })
                .collect()
        })
        .collect();
    let mut head = vec![0; DEVICES.len()];
    let (mut done, mut fired) = (BTreeSet::new(), BTreeSet::new());
    let mut progress = true;
    while progress {
        progress = false;
        for (d, q) in queues.iter().enumerate() {
            while let Some(&i) = q.get(head[d]) {
                match prog[i] {
                    Op::Wait(_, f) if !fired.contains(&f) => break,
                    Op::Wait(..) => {}
                    Op::Signal(_, f) => {
                        fired.insert(f);
                    }
                    Op::Cmd(_) => {
                        done.insert(i);
                    }
                }
                head[d] += 1;
                progress = true;
            }
        }
    }
    (done, fired)
}

/// Runs one program on a fresh connection; panics with the seed on any disagreement. Odd
/// seeds send each command as one that takes its region's access itself
/// ([`Opcode::DeviceCmdAccess`], which may park on a copy and ends its access when answered);
/// even seeds hold both devices' accesses for the whole program and send plain commands.
fn run(socket: &std::path::Path, seed: u64) {
    let prog = program(seed);
    let own_access = seed % 2 == 1;
    let (done, fired) = model(&prog);
    let c = Connection::connect(
        socket,
        &ConnectOptions {
            window_size: 16 << 20,
            sq_entries: 16,
            cq_entries: 16,
            ..ConnectOptions::default()
        },
    )
    .expect("connect");
    let id = c.alloc_blob(4096).expect("alloc").id;
    for d in DEVICES.iter().filter(|_| !own_access) {
        c.begin_access(id, *d, 0, 4096, AccessMode::Read)
            .expect("begin");
    }
    let opcode = if own_access {
        Opcode::DeviceCmdAccess
    } else {
        Opcode::DeviceCmd
    };
    let fences: Vec<Fence> = (0..FENCES)
        .map(|_| c.fence_create().expect("fence"))
        .collect();
    let mut seqs = vec![None; prog.len()];
    for (i, op) in prog.iter().enumerate() {
        match *op {
            Op::Cmd(d) => {
                let args = [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0];
                seqs[i] = Some(c.submit(opcode, DEVICES[d], args).expect("submit"));
            }
            Op::Wait(d, f) => c.fence_wait(DEVICES[d], fences[f]).expect("wait"),
            Op::Signal(d, f) => c.fence_signal(DEVICES[d], fences[f]).expect("signal"),
        }
    }
    // Progress goes to stderr, shown only when the test fails (which phase hung).
    eprintln!(
        "seed {seed}: submitted; model: {} commands, fences {fired:?}",
        done.len()
    );
    // Liveness: everything the model completes without the CPU completes.
    for f in &fired {
        let ok = c.fence_wait_cpu(fences[*f], Duration::from_secs(60));
        assert!(
            ok.expect("fence page"),
            "seed {seed}: fence {f} never fired"
        );
    }
    for &i in &done {
        let r = c.wait(seqs[i].expect("a command")).expect("completion");
        assert_eq!(r.status, 0, "seed {seed}: command {i} failed");
    }
    eprintln!("seed {seed}: the model's part completed");
    // Safety: a fence whose signal sits behind an unsignaled wait has not fired.
    for f in (0..FENCES).filter(|f| !fired.contains(f)) {
        let s = c.fence_signaled(fences[f]).expect("fence page");
        assert!(
            !s,
            "seed {seed}: fence {f} fired before its wait was satisfied"
        );
    }
    // The roots from the CPU: now everything completes.
    let roots: Vec<usize> = (0..FENCES)
        .filter(|f| {
            !prog
                .iter()
                .any(|op| matches!(op, Op::Signal(_, g) if g == f))
        })
        .collect();
    for &f in &roots {
        c.fence_signal(DeviceId::CPU, fences[f])
            .expect("cpu signal");
    }
    eprintln!("seed {seed}: roots {roots:?} signaled");
    // (A completion is taken once: the model's part was waited for above.)
    for (i, s) in seqs.iter().enumerate().filter(|(i, _)| !done.contains(i)) {
        if let Some(s) = s {
            let r = c.wait(*s).expect("completion");
            assert_eq!(
                r.status, 0,
                "seed {seed}: command {i} failed after the roots"
            );
        }
    }
    for (f, fence) in fences.iter().enumerate() {
        let ok = c.fence_wait_cpu(*fence, Duration::from_secs(60));
        assert!(
            ok.expect("fence page"),
            "seed {seed}: fence {f} never fired"
        );
        c.fence_release(*fence).expect("release");
    }
    for d in DEVICES.iter().filter(|_| !own_access) {
        c.end_access(id, *d, 0, 4096, AccessMode::Read)
            .expect("end");
    }
    c.drain().expect("drain");
}

#[test]
fn the_model_generates_programs_that_park_work_beyond_the_rings() {
    // The generator is what makes the daemon test mean something: check that its programs
    // park more commands than a ring holds and use both device signals and CPU roots.
    let mut parked_max = 0;
    let (mut device_signals, mut roots) = (0, 0);
    for seed in 0..24 {
        let prog = program(seed);
        let cmds = prog.iter().filter(|o| matches!(o, Op::Cmd(_))).count();
        parked_max = parked_max.max(cmds - model(&prog).0.len());
        device_signals += prog.iter().filter(|o| matches!(o, Op::Signal(..))).count();
        roots += FENCES - prog.iter().filter(|o| matches!(o, Op::Signal(..))).count();
    }
    assert!(
        parked_max > 16,
        "no program parks more than a ring: {parked_max}"
    );
    assert!(device_signals > 0 && roots > 0);
    // The model itself: a wait blocks its queue until the fence fires.
    let prog = [Op::Wait(0, 0), Op::Cmd(0), Op::Cmd(1), Op::Signal(1, 1)];
    let (done, fired) = model(&prog);
    assert_eq!(done, BTreeSet::from([2]));
    assert_eq!(fired, BTreeSet::from([1]));
}

#[test]
fn no_program_of_commands_and_fences_deadlocks_a_session() {
    let d = Daemon::start(&[]);
    let socket = d.socket().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for seed in 0..24 {
            run(&socket, seed);
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(300))
        .expect("a session deadlocked (or a check failed: see the panic above)");
}
