// The fused two-layer composition (fused.wgsl) as a compute pass: four horizontally
// adjacent target pixels per invocation, written to a storage image (group 2). No
// rasterizer, no colour attachment and no blend unit: on a CPU Vulkan driver this is the
// cheaper path (see the floor in floor.wgsl); on a GPU either is fine.

@group(2) @binding(0) var t_out: texture_storage_2d<rgba8unorm, write>;

@compute @workgroup_size(8, 8, 1)
fn cs_fused(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = u32(P.target_size.x);
    if (gid.y >= u32(P.target_size.y)) {
        return;
    }
    let py = f32(gid.y) + 0.5;
    for (var i = 0u; i < 4u; i++) {
        let x = gid.x * 4u + i;
        if (x < w) {
            let px = f32(x) + 0.5;
            let c0 = layer_color(px, py);
            let a0 = c0.a * P.misc.z;
            let c1 = layer_color2(px, py);
            let a1 = c1.a * P2.misc.z;
            var o = vec4<f32>(c1.rgb, a1);
            if (BLEND2) {
                o = vec4<f32>(c1.rgb * a1 + c0.rgb * (1.0 - a1), a1 + a0 * (1.0 - a1));
            }
            textureStore(t_out, vec2<i32>(i32(x), i32(gid.y)), o);
        }
    }
}
