// Colour conversion and scaling as a compute shader (the ISP's GPU path):
// one invocation per target pixel, packed into a u32 array with rows
// P.target_size.z pixels apart (256-byte aligned, so the array can be copied
// into the destination texture).

@group(0) @binding(5) var<storage, read_write> out_px: array<u32>;

@compute @workgroup_size(8, 8, 1)
fn cs_convert(@builtin(global_invocation_id) gid: vec3<u32>) {
    let tw = u32(P.target_size.x);
    let th = u32(P.target_size.y);
    if (gid.x >= tw || gid.y >= th) {
        return;
    }
    let sc = layer_coord(f32(gid.x) + 0.5, f32(gid.y) + 0.5);
    var c = sample_src(sc.x, sc.y, true);
    c = vec4<f32>(c.rgb, c.a * P.misc.z);
    if (P.modes.w == 1u) {
        c = c.bgra;
    }
    out_px[gid.y * u32(P.target_size.z) + gid.x] = pack4x8unorm(c);
}
