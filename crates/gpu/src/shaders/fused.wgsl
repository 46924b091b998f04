// Two full-screen layers in one pass: the bottom layer (group 0, opaque over the whole
// target) and the layer over it (group 1), sampled and blended per pixel in the shader, so
// the target is written once instead of twice. The group-1 sampling code is common.wgsl with
// its names suffixed by 2 (made when the module is built); BLEND2 is the top layer's blend.

override BLEND2: bool = true;

@fragment
fn fs_fused(in: VsOut) -> @location(0) vec4<f32> {
    let c0 = layer_color(in.pos.x, in.pos.y);
    let a0 = c0.a * P.misc.z;
    let c1 = layer_color2(in.pos.x, in.pos.y);
    let a1 = c1.a * P2.misc.z;
    if (!BLEND2) {
        return vec4<f32>(c1.rgb, a1);
    }
    return vec4<f32>(c1.rgb * a1 + c0.rgb * (1.0 - a1), a1 + a0 * (1.0 - a1));
}
