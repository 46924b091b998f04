// Floor measurement: the least work a full-screen NV12 -> RGBA pass can do on
// this device (hardware bilinear sampling, no crop clamping, no uniforms).
// Output size through override constants (no textureDimensions).

override FW: f32 = 1.0;
override FH: f32 = 1.0;

@group(0) @binding(0) var f_y: texture_2d<f32>;
@group(0) @binding(1) var f_uv: texture_2d<f32>;
@group(0) @binding(2) var f_s: sampler;

fn nv12_rgb(y: f32, uv: vec2<f32>) -> vec3<f32> {
    let yy = 1.164383 * (y - 0.0627451);
    let c = uv - vec2<f32>(0.5019608);
    let rgb = vec3<f32>(
        yy + 1.596027 * c.y,
        yy - 0.391762 * c.x - 0.812968 * c.y,
        yy + 2.017232 * c.x,
    );
    return clamp(rgb, vec3<f32>(0.0), vec3<f32>(1.0));
}

struct FOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

// One triangle covering the whole target.
@vertex
fn vs_floor(@builtin(vertex_index) vi: u32) -> FOut {
    let p = vec2<f32>(f32((vi << 1u) & 2u), f32(vi & 2u));
    var out: FOut;
    out.pos = vec4<f32>(p.x * 2.0 - 1.0, 1.0 - p.y * 2.0, 0.0, 1.0);
    out.uv = p;
    return out;
}

@fragment
fn fs_floor(in: FOut) -> @location(0) vec4<f32> {
    let y = textureSampleLevel(f_y, f_s, in.uv, 0.0).r;
    let uv = textureSampleLevel(f_uv, f_s, in.uv, 0.0).rg;
    return vec4<f32>(nv12_rgb(y, uv), 1.0);
}

@group(0) @binding(3) var f_out: texture_storage_2d<rgba8unorm, write>;

// Four horizontally adjacent pixels per invocation.
@compute @workgroup_size(8, 8, 1)
fn cs_floor(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = u32(FW);
    if (gid.y >= u32(FH)) {
        return;
    }
    let inv = vec2<f32>(1.0 / FW, 1.0 / FH);
    let y = i32(gid.y);
    let cy = (f32(gid.y) + 0.5) * inv.y;
    for (var i = 0u; i < 4u; i++) {
        let x = gid.x * 4u + i;
        if (x < w) {
            let l = textureLoad(f_y, vec2<i32>(i32(x), y), 0).r;
            let c = textureSampleLevel(f_uv, f_s, vec2<f32>((f32(x) + 0.5) * inv.x, cy), 0.0).rg;
            textureStore(f_out, vec2<i32>(i32(x), y), vec4<f32>(nv12_rgb(l, c), 1.0));
        }
    }
}
