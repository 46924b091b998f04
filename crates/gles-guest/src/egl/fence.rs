//! Fence syncs (`EGL_KHR_fence_sync`, EGL 1.5): a fence is signalled once the host ran
//! everything before it, so creating one is a round trip and waiting on it returns at once.

use super::api::{
    display, finish_current, guard, pairs, put, EglAttrib, EglBool, EglInt, Handle, NO,
};
use super::consts::*;
use super::state::{from_handle, table, to_handle};
use crate::rt;

fn create_sync(dpy: Handle, kind: u32, attribs: Vec<(i32, i32)>) -> Handle {
    guard(NO, || {
        {
            let t = table();
            display(&t, dpy)?;
        }
        if kind != EGL_SYNC_FENCE_KHR {
            return Err(EGL_BAD_ATTRIBUTE);
        }
        if !attribs.is_empty() {
            return Err(EGL_BAD_ATTRIBUTE);
        }
        if rt::current().is_none() {
            return Err(EGL_BAD_MATCH);
        }
        // A fence is signalled once the host ran everything before it: a round trip.
        finish_current()?;
        let mut t = table();
        let id = t.next_id();
        t.syncs.insert(id, from_handle(dpy));
        Ok(to_handle(id))
    })
}

/// `eglCreateSyncKHR`.
pub extern "C" fn eglCreateSyncKHR(dpy: Handle, kind: u32, attribs: *const EglInt) -> Handle {
    create_sync(dpy, kind, pairs(attribs))
}

/// `eglCreateSync`.
pub extern "C" fn eglCreateSync(dpy: Handle, kind: u32, attribs: *const EglAttrib) -> Handle {
    create_sync(dpy, kind, pairs(attribs))
}

/// `eglDestroySync` / `eglDestroySyncKHR`.
pub extern "C" fn eglDestroySync(dpy: Handle, sync: Handle) -> EglBool {
    guard(EGL_FALSE, || {
        let mut t = table();
        display(&t, dpy)?;
        t.syncs
            .remove(&from_handle(sync))
            .ok_or(EGL_BAD_PARAMETER)?;
        Ok(EGL_TRUE)
    })
}

/// `eglClientWaitSync` / `eglClientWaitSyncKHR`: fences are signalled when made.
pub extern "C" fn eglClientWaitSync(
    dpy: Handle,
    sync: Handle,
    _flags: EglInt,
    _timeout: u64,
) -> EglInt {
    guard(EGL_FALSE as EglInt, || {
        let t = table();
        display(&t, dpy)?;
        t.syncs.get(&from_handle(sync)).ok_or(EGL_BAD_PARAMETER)?;
        Ok(EGL_CONDITION_SATISFIED_KHR)
    })
}

/// `eglWaitSync` / `eglWaitSyncKHR`: the server already waited.
pub extern "C" fn eglWaitSync(dpy: Handle, sync: Handle, _flags: EglInt) -> EglInt {
    guard(EGL_FALSE as EglInt, || {
        let t = table();
        display(&t, dpy)?;
        t.syncs.get(&from_handle(sync)).ok_or(EGL_BAD_PARAMETER)?;
        Ok(EGL_TRUE as EglInt)
    })
}

fn sync_attrib(dpy: Handle, sync: Handle, attr: EglInt) -> Result<EglInt, i32> {
    let t = table();
    display(&t, dpy)?;
    t.syncs.get(&from_handle(sync)).ok_or(EGL_BAD_PARAMETER)?;
    Ok(match attr {
        EGL_SYNC_TYPE_KHR => EGL_SYNC_FENCE_KHR as EglInt,
        EGL_SYNC_STATUS_KHR => EGL_SIGNALED_KHR,
        EGL_SYNC_CONDITION_KHR => EGL_SYNC_PRIOR_COMMANDS_COMPLETE_KHR,
        _ => return Err(EGL_BAD_ATTRIBUTE),
    })
}

/// `eglGetSyncAttribKHR`.
pub extern "C" fn eglGetSyncAttribKHR(
    dpy: Handle,
    sync: Handle,
    attr: EglInt,
    value: *mut EglInt,
) -> EglBool {
    guard(EGL_FALSE, || {
        put(value, sync_attrib(dpy, sync, attr)?);
        Ok(EGL_TRUE)
    })
}

/// `eglGetSyncAttrib`.
pub extern "C" fn eglGetSyncAttrib(
    dpy: Handle,
    sync: Handle,
    attr: EglInt,
    value: *mut EglAttrib,
) -> EglBool {
    guard(EGL_FALSE, || {
        put(value, sync_attrib(dpy, sync, attr)? as EglAttrib);
        Ok(EGL_TRUE)
    })
}
