//! The table `virtsoc bench isolation` prints: one row per hostile kind, the failed checks
//! and first refusals below it.

use super::{IsolationReport, STALL_MS};

/// Prints the report as a table.
pub fn print_table(r: &IsolationReport) {
    println!(
        "Isolation: a victim guest (SVM write->read access p50 under prefetch, 1 MiB, {} \
         frames; camera scenario 720p30 presented fps, {:.0} s; 640x360 H.264 pictures \
         decoded one at a time, ms from decode to picture, p50 and p99) alone, then next to \
         each hostile guest, in {} interleaved rounds; medians over the rounds (% = median \
         of the rounds' with/alone); check: access and camera within {:.0}% of alone, the \
         decoder's p99 at most {STALL_MS:.0} ms (no stall; its p50 is reported, not checked)",
        r.frames, r.seconds, r.rounds, r.tolerance_pct
    );
    println!(
        "{:<18} {:>8} {:>8} {:>5} {:>7} {:>6} {:>5} {:>11} {:>11} {:>5} {:>8} {:>8} {:>6} {:>9} {:>9}",
        "hostile",
        "alone us",
        "with us",
        "%",
        "alone fps",
        "with",
        "%",
        "dec p50 alone",
        "with",
        "%",
        "p99 alone",
        "with",
        "check",
        "ops",
        "refused"
    );
    for row in &r.rows {
        println!(
            "{:<18} {:>8.2} {:>8.2} {:>5.0} {:>7.1} {:>6.1} {:>5.0} {:>11.2} {:>11.2} {:>5.0} \
             {:>8.2} {:>8.2} {:>6} {:>9} {:>9}",
            row.hostile,
            row.alone_access_p50_us,
            row.access_p50_us,
            row.access_pct_of_alone,
            row.alone_camera_fps,
            row.camera_fps,
            row.fps_pct_of_alone,
            row.alone_decode_p50_ms,
            row.decode_p50_ms,
            row.decode_pct_of_alone,
            row.alone_decode_p99_ms,
            row.decode_p99_ms,
            if row.ok { "ok" } else { "FAIL" },
            row.hostile_ops,
            row.hostile_refused,
        );
    }
    for row in r.rows.iter().filter(|r| !r.ok) {
        println!("{}: {}", row.hostile, row.check);
    }
    for row in r.rows.iter().filter(|r| r.hostile_refusal.is_some()) {
        println!(
            "{}: first refusal: {}",
            row.hostile,
            row.hostile_refusal.as_deref().unwrap_or("")
        );
    }
    println!(
        "all within {:.0}% and without a stall: {}",
        r.tolerance_pct,
        if r.all_ok { "yes" } else { "no" }
    );
}
