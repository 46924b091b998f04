// AR markers: one instanced quad per marker, slightly larger than the marker;
// the fragment shader decides coverage exactly like the CPU reference.

struct MarkerParams {
    // Target width, target height, unused, unused.
    target_size: vec4<f32>,
};

@group(0) @binding(0) var<uniform> M: MarkerParams;

struct MOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) @interpolate(flat) centre_size: vec3<f32>,
    @location(1) @interpolate(flat) shape: u32,
    @location(2) @interpolate(flat) color: vec4<f32>,
};

@vertex
fn vs_marker(
    @builtin(vertex_index) vi: u32,
    @location(0) centre_size: vec3<f32>,
    @location(1) shape: u32,
    @location(2) color: vec4<f32>,
) -> MOut {
    var corners = array<vec2<f32>, 6>(
        vec2<f32>(-1.0, -1.0), vec2<f32>(1.0, -1.0), vec2<f32>(-1.0, 1.0),
        vec2<f32>(-1.0, 1.0), vec2<f32>(1.0, -1.0), vec2<f32>(1.0, 1.0),
    );
    let half = centre_size.z * 0.5 + 1.0;
    let p = centre_size.xy + corners[vi] * half;
    var out: MOut;
    out.pos = vec4<f32>(p.x / M.target_size.x * 2.0 - 1.0, 1.0 - p.y / M.target_size.y * 2.0, 0.0, 1.0);
    out.centre_size = centre_size;
    out.shape = shape;
    out.color = color;
    return out;
}

@fragment
fn fs_marker(in: MOut) -> @location(0) vec4<f32> {
    let half = in.centre_size.z * 0.5;
    let dx = in.pos.x - in.centre_size.x;
    let dy = in.pos.y - in.centre_size.y;
    let inside = dx >= -half && dx < half && dy >= -half && dy < half;
    var covered = inside;
    if (in.shape == 1u) {
        let t = max(in.centre_size.z * 0.2, 2.0) * 0.5;
        covered = inside && (abs(dx) < t || abs(dy) < t);
    }
    if (!covered) {
        discard;
    }
    return in.color;
}
