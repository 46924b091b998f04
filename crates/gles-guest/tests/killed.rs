//! A render worker killed while its guest renders: the guest's next swaps find the
//! context lost (`EGL_CONTEXT_LOST`), new contexts fail (`EGL_BAD_ALLOC`), and the daemon
//! goes on serving other guests.
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`; without them (or without glvnd) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use common::{dlopen, skip, sym, H};

/// The processes whose parent is `parent` and whose name is `name`.
fn children(parent: u32, name: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // pid (comm) state ppid ...
            let Some((comm, rest)) = stat.split_once(") ") else {
                return false;
            };
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            comm.ends_with(&format!("({name}")) && ppid == Some(parent)
        })
        .collect()
}

#[test]
fn a_killed_render_worker_loses_the_guests_contexts_only() {
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-killed-{}", std::process::id()));
    let Some((d, sock, _)) = common::start_daemon(&tmp, &[]) else {
        return;
    };
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    if egl.is_null() || gles.is_null() {
        return skip("glvnd's libEGL.so.1 / libGLESv2.so.2 not installed");
    }
    let pb = common::pbuffer(egl, &common::ES2_PBUFFER, 2, (32, 32));
    let (dpy, config, surf) = (pb.dpy, pb.config, pb.surf);
    let ctx_attrs = [0x3098, 2, 0x3038];
    let create_context: extern "C" fn(H, H, H, *const i32) -> H = sym(egl, c"eglCreateContext");
    let swap: extern "C" fn(H, H) -> u32 = sym(egl, c"eglSwapBuffers");
    let get_error: extern "C" fn() -> i32 = sym(egl, c"eglGetError");
    let clear: extern "C" fn(u32) = sym(gles, c"glClear");
    clear(0x4000);
    assert_eq!(
        swap(dpy, surf),
        1,
        "a swap before the kill: {:#x}",
        get_error()
    );

    let workers = children(d.0.id(), "virtsoc-render");
    assert_eq!(
        workers.len(),
        1,
        "one render worker for the guest: {workers:?}"
    );
    // SAFETY: SIGKILL to the daemon's child found above.
    assert_eq!(unsafe { libc::kill(workers[0], libc::SIGKILL) }, 0);

    let mut lost = false;
    for _ in 0..6 {
        clear(0x4000);
        if swap(dpy, surf) == 0 {
            assert_eq!(get_error(), 0x300E, "EGL_CONTEXT_LOST");
            lost = true;
            break;
        }
    }
    assert!(lost, "the swaps after the kill find the context lost");
    assert!(create_context(dpy, config, std::ptr::null_mut(), ctx_attrs.as_ptr()).is_null());
    assert_eq!(get_error(), 0x3003, "EGL_BAD_ALLOC");

    let other = virtsoc_guest::Connection::open(
        sock.to_str().expect("utf-8 path"),
        &virtsoc_guest::ConnectOptions::default(),
    )
    .expect("another guest connects");
    other.nop().expect("and is served");
    let _ = std::fs::remove_dir_all(&tmp);
}
