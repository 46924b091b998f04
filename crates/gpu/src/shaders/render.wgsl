// Layer composition and equirect projection (render pipelines).

struct VsOut {
    @builtin(position) pos: vec4<f32>,
};

// Two triangles covering dst_rect (target pixels), converted to NDC; the
// rasterizer clips whatever lies outside the target.
@vertex
fn vs_rect(@builtin(vertex_index) vi: u32) -> VsOut {
    var corners = array<vec2<f32>, 6>(
        vec2<f32>(0.0, 0.0), vec2<f32>(1.0, 0.0), vec2<f32>(0.0, 1.0),
        vec2<f32>(0.0, 1.0), vec2<f32>(1.0, 0.0), vec2<f32>(1.0, 1.0),
    );
    let c = corners[vi];
    let p = P.dst_rect.xy + c * P.dst_rect.zw;
    let ndc = vec2<f32>(p.x / P.target_size.x * 2.0 - 1.0, 1.0 - p.y / P.target_size.y * 2.0);
    var out: VsOut;
    out.pos = vec4<f32>(ndc, 0.0, 1.0);
    return out;
}

@fragment
fn fs_layer(in: VsOut) -> @location(0) vec4<f32> {
    let c = layer_color(in.pos.x, in.pos.y);
    return vec4<f32>(c.rgb, c.a * P.misc.z);
}

@fragment
fn fs_equirect(in: VsOut) -> @location(0) vec4<f32> {
    let sc = equirect_coord(in.pos.x, in.pos.y);
    return sample_src(sc.x, sc.y, false);
}
