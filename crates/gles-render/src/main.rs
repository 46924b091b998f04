//! `virtsoc-render`: the render worker process the daemon starts per guest.
fn main() {}
