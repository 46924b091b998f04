//! The soak's checks: what the daemon's process and the guests' tally must show at the end
//! of the run (memory, descriptors, threads and sessions back; good data right; misuse
//! refused; the daemon alive).

use super::{get, Check, ProcStats, Role, Tally, RSS_SLACK};

/// What was measured of the daemon around the run.
pub(super) struct Outcome {
    /// After the warm-up.
    pub(super) start: ProcStats,
    /// After the run, settled.
    pub(super) end: ProcStats,
    /// Sessions still referenced though ended (`None`: the control API did not answer).
    pub(super) lingering: Option<u64>,
    /// Whether it still ran and served a guest.
    pub(super) daemon_alive: bool,
    /// Its process id.
    pub(super) pid: u32,
}

/// The checks of a run of `roles` that left `t` and `o`.
pub(super) fn checks(o: &Outcome, t: &Tally, roles: &[Role]) -> Vec<Check> {
    let Outcome {
        start,
        end,
        lingering,
        daemon_alive,
        pid,
    } = *o;
    let mut checks = Vec::new();
    let mut check = |name: &str, ok: bool, detail: String| {
        checks.push(Check {
            name: name.into(),
            ok,
            detail,
        })
    };
    let limit = (start.rss_kib as f64 * (1.0 + RSS_SLACK)) as u64;
    check(
        "rss",
        end.rss_kib <= limit,
        format!(
            "{} KiB -> {} KiB (limit {limit} KiB)",
            start.rss_kib, end.rss_kib
        ),
    );
    check(
        "fds",
        end.fds <= start.fds,
        format!("{} -> {}", start.fds, end.fds),
    );
    check(
        "sessions released",
        lingering == Some(0),
        match lingering {
            Some(n) => format!("{n} ended sessions still referenced in the daemon"),
            None => "the control API did not answer".into(),
        },
    );
    check(
        "threads",
        end.threads <= start.threads,
        format!("{} -> {}", start.threads, end.threads),
    );
    let rounds = get(&t.good_rounds);
    check(
        "good data",
        (rounds > 0 || !roles.contains(&Role::Good))
            && get(&t.good_bad_data) == 0
            && get(&t.good_errors) == 0,
        format!(
            "{rounds} rounds, {} wrong, {} errors",
            get(&t.good_bad_data),
            get(&t.good_errors)
        ),
    );
    check(
        "hostile refused",
        get(&t.hostile_accepted) == 0,
        format!(
            "{} misuses accepted of {}",
            get(&t.hostile_accepted),
            get(&t.hostile_requests)
        ),
    );
    check(
        "crashing guests",
        get(&t.crash_failures) == 0,
        format!(
            "{} killed, {} failed to start",
            get(&t.crashes),
            get(&t.crash_failures)
        ),
    );
    check(
        "reconnects",
        get(&t.reconnect_errors) == 0,
        format!(
            "{} sessions, {} errors",
            get(&t.reconnects),
            get(&t.reconnect_errors)
        ),
    );
    check("daemon alive", daemon_alive, format!("pid {pid}"));
    checks
}
