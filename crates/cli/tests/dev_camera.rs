//! Integration tests of the camera device through a real daemon: captures into image regions
//! read back on the CPU (capture times on the daemon's clock, stamped into the pixels; the
//! moving square where the reply says it is), and the errors for regions the camera cannot
//! fill.

mod common;

use common::{
    camera_capture as capture, connect, region_bytes as read_region, region_meta as meta,
    status_of, Daemon,
};
use virtsoc_guest::devices::camera;
use virtsoc_guest::{DeviceCommand, Format, Status};
use virtsoc_host::clock::now_ns;
use virtsoc_host::device::camera::read_capture_time;

#[test]
fn captures_carry_their_time_and_a_moving_marker() {
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let frame = c.alloc(0, 1280, 720, Format::Nv12, 0).unwrap();
    let mut last: Option<camera::CaptureReply> = None;
    for i in 0..4 {
        let before = now_ns();
        let r = capture(&c, &frame);
        let after = now_ns();
        assert_eq!(r.index, i, "frames count from 0 per guest and mode");
        assert!(
            (before..=after).contains(&r.capture_ns),
            "capture time {} is on the daemon's CLOCK_MONOTONIC ({before}..{after})",
            r.capture_ns
        );
        let px = read_region(&c, &frame);
        let luma = &px[..1280 * 720];
        let (lo, hi) = (luma.iter().min().unwrap(), luma.iter().max().unwrap());
        assert!(hi - lo > 100, "frame {i} is not blank ({lo}..{hi})");
        assert_eq!(
            read_capture_time(&meta(&frame), &px),
            Some(r.capture_ns),
            "frame {i}: the pixels carry the capture time"
        );
        // The square is white (Y 235) around the reported centre.
        let (mx, my) = (r.marker_x as usize, r.marker_y as usize);
        assert!(mx < 1280 && my < 720);
        assert_eq!(
            luma[my * 1280 + mx],
            235,
            "frame {i}: marker at ({mx}, {my})"
        );
        if let Some(prev) = last {
            assert!(r.capture_ns > prev.capture_ns);
            assert_ne!(
                (r.marker_x, r.marker_y),
                (prev.marker_x, prev.marker_y),
                "the marker moves"
            );
        }
        last = Some(r);
    }

    // Other formats and another guest: their own cameras, counting from 0.
    let other = connect(&d);
    for (format, w, h) in [
        (Format::Yuv420p, 640, 360),
        (Format::Rgba8, 320, 240),
        (Format::Bgra8, 1280, 720),
    ] {
        let r = other.alloc(0, w, h, format, 0).unwrap();
        let rep = capture(&other, &r);
        assert_eq!(rep.index, 0, "{format:?}");
        assert_eq!(
            read_capture_time(&meta(&r), &read_region(&other, &r)),
            Some(rep.capture_ns),
            "{format:?}"
        );
    }
    assert_eq!(
        capture(&c, &frame).index,
        4,
        "the first guest's camera went on"
    );
}

#[test]
fn regions_the_camera_cannot_fill_are_refused() {
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let blob = c.alloc_blob(1 << 20).unwrap();
    let yuyv = c.alloc(0, 640, 480, Format::Yuyv, 0).unwrap();
    let odd = c.alloc(0, 321, 241, Format::Rgba8, 0).unwrap();
    let tiny = c.alloc(0, 32, 16, Format::Nv12, 0).unwrap();
    for (r, want) in [
        (blob.id, Status::NotSupported),
        (yuyv.id, Status::NotSupported),
        (odd.id, Status::BadArgument),
        (tiny.id, Status::BadArgument),
    ] {
        assert_eq!(
            status_of(c.command_with_access(&camera::Capture { frame: r })),
            want,
            "region {r}"
        );
    }
    // Another guest's region: region ids are per guest, so name one it does not have.
    let other = connect(&d);
    let mine = c.alloc(0, 640, 480, Format::Nv12, 0).unwrap();
    assert!(other.region(mine.id).is_none());
    assert_eq!(
        status_of(other.device_cmd(camera::ID, camera::Capture { frame: mine.id }.encode())),
        Status::NoSuchRegion
    );
    // Without begin_access from the camera, the device may not touch the region.
    assert_eq!(
        status_of(c.device_cmd(camera::ID, camera::Capture { frame: mine.id }.encode())),
        Status::BadArgument
    );
    // Still serving.
    assert_eq!(capture(&c, &mine).index, 0);
}
