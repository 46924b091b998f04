//! A migration target that dies at each phase of a live migration (`virtsocd
//! --migrate-fault PHASE`, the target exits there): during the pre-copy, during the
//! stop-and-copy, right after it accepted the session (`READY`), and when the guest arrived
//! and its session was restored there but before the source committed. Each time the guest
//! goes on at its source with every region's bytes, its fences and its region count intact,
//! and keeps working there.

mod common;

use std::time::Duration;

use common::{
    connect_to, cpu_read, cpu_write, free_port, guest_state, migration_daemon, pattern,
    request_migration,
};
use virtsoc_guest::DeviceId;

const TOKEN: &str = "migration-fault-token-0123456789";

/// Whether the target accepted the session before dying (the source handed the guest over).
fn handed_over(phase: &str) -> bool {
    matches!(phase, "ready" | "resume")
}

fn target_dies_at(phase: &str) {
    let token_file =
        std::env::temp_dir().join(format!("virtsoc-migf-{phase}-{}.token", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let (pa, pb) = (free_port(), free_port());
    let a = migration_daemon(&token_file, pa, None);
    let mut b = migration_daemon(&token_file, pb, Some(phase));
    let g = connect_to(a.socket());
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let sizes = [2usize << 20, 300_000, 4096];
    let seeds = [11u8, 12, 13];
    let (ids, signaled, pending) = guest_state(&g, &sizes, &seeds);
    let id = g.guest_id();

    let (status, v) = request_migration(&a, id, &format!("127.0.0.1:{pb}"), TOKEN);
    if handed_over(phase) {
        // Accepted (handed over); the commit never comes.
        assert_eq!(status, 200, "{phase}: {v}");
    } else {
        assert_eq!(status, 409, "{phase}: {v}");
    }

    // The guest goes on at its source: every byte, fence and region is there. (After a
    // hand-over its next call sends it to the target, which is gone or dies there, and
    // back to the source, which resumes the session it kept.)
    for ((&rid, &n), &s) in ids.iter().zip(&sizes).zip(&seeds) {
        assert_eq!(cpu_read(&g, rid, n), pattern(n, s), "{phase}: region {rid}");
    }
    assert!(g.fence_signaled(signaled).unwrap(), "{phase}");
    assert!(!g.fence_signaled(pending).unwrap(), "{phase}");
    assert_eq!(g.usage().unwrap().0, 3, "{phase}");
    let status = b.child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(86),
        "{phase}: the target exited at the fault"
    );
    if handed_over(phase) {
        a.expect_log("did not confirm the guest's resume");
        a.expect_log("the guest resumes here");
    } else {
        assert_eq!(g.guest_id(), id, "{phase}: the guest never noticed");
    }
    // Its session at the source works as before.
    cpu_write(&g, ids[0], &pattern(sizes[0], 99));
    assert_eq!(cpu_read(&g, ids[0], sizes[0]), pattern(sizes[0], 99));
    g.fence_signal(DeviceId::CPU, pending).unwrap();
    g.nop().unwrap();
    assert!(g.fence_signaled(pending).unwrap(), "{phase}");
    let next = g.alloc_blob(4096).unwrap().id;
    assert!(
        ids.iter().all(|&r| r != next),
        "{phase}: ids are not reused"
    );
    std::fs::remove_file(&token_file).ok();
}

#[test]
fn a_target_dying_during_the_precopy_leaves_the_guest_on_its_source() {
    target_dies_at("precopy");
}

#[test]
fn a_target_dying_during_the_stop_and_copy_leaves_the_guest_on_its_source() {
    target_dies_at("stop");
}

#[test]
fn a_target_dying_after_it_accepted_the_session_leaves_the_guest_on_its_source() {
    target_dies_at("ready");
}

#[test]
fn a_target_dying_before_it_confirmed_the_resume_leaves_the_guest_on_its_source() {
    target_dies_at("resume");
}
