// Shared sampling code; mirrors src/cpu.rs (see the crate docs for conventions).

// Pipeline specialisation (one pipeline per value, so no per-pixel branching
// on the source format; CPU Vulkan drivers run every branch of a shader).
// Source format: 0 packed RGBA/BGRA, 1 NV12, 2 YUV420P.
override SRC_MODE: u32 = 0u;
// Luma samples land exactly on texel centres (unscaled layer): one fetch
// instead of four. Only set when that holds for every pixel.
override LUMA_EXACT: bool = false;
// The layer maps the target 1:1 onto its whole source (same size, no offset, no
// rotation, the crop is the whole source): one fetch of luma at the pixel, chroma
// sampled without crop clamping (the clamp-to-edge sampler gives the same values).
override IDENT: bool = false;

struct Params {
    // Destination rectangle: x, y, width, height (target pixels).
    dst_rect: vec4<f32>,
    // Layer mapping, target pixel (relative to dst_rect) -> source luma
    // pixel: sx = map_b.x + map_m.x * rx + map_m.y * ry,
    //        sy = map_b.y + map_m.z * rx + map_m.w * ry.
    map_m: vec4<f32>,
    map_b: vec4<f32>,
    // Crop: x, y, width, height (source luma pixels).
    crop: vec4<f32>,
    // Source width, source height, plane alpha, tan(fov_y / 2).
    misc: vec4<f32>,
    // cos(yaw), sin(yaw), cos(pitch), sin(pitch).
    rot: vec4<f32>,
    // Target width, target height, output row pitch in pixels (convert
    // only), unused.
    target_size: vec4<f32>,
    // Unused, unused, unused, swap red/blue on output (0/1, convert only).
    modes: vec4<u32>,
};

@group(0) @binding(0) var<uniform> P: Params;
// Y plane, or the packed RGBA/BGRA image.
@group(0) @binding(1) var t_luma: texture_2d<f32>;
// NV12 interleaved UV (RG8) or YUV420P U (R8); a dummy for packed RGB.
@group(0) @binding(2) var t_c0: texture_2d<f32>;
// YUV420P V (R8); a dummy otherwise.
@group(0) @binding(3) var t_c1: texture_2d<f32>;
// Linear filtering; clamp-to-edge (composition, convert) or repeating
// horizontally (equirect).
@group(0) @binding(4) var s_lin: sampler;

fn clamp_axis(c: f32, lo_edge: f32, hi_edge: f32) -> f32 {
    var lo = lo_edge + 0.5;
    var hi = hi_edge - 0.5;
    if (lo > hi) {
        let m = 0.5 * (lo_edge + hi_edge);
        lo = m;
        hi = m;
    }
    return min(max(c, lo), hi);
}

fn yuv_to_rgb(y: f32, u: f32, v: f32) -> vec3<f32> {
    let yy = 1.164383 * (y - 0.0627451);
    let uu = u - 0.5019608;
    let vv = v - 0.5019608;
    let rgb = vec3<f32>(
        yy + 1.596027 * vv,
        yy - 0.391762 * uu - 0.812968 * vv,
        yy + 2.017232 * uu,
    );
    return clamp(rgb, vec3<f32>(0.0), vec3<f32>(1.0));
}

// Hardware bilinear filtering (linear, clamp-to-edge; repeat horizontally for
// the equirect projection) at continuous texel coordinates (x, y), texel
// centres at i + 0.5: one textureSampleLevel instead of four textureLoads.
fn sample_tex(t: texture_2d<f32>, dims: vec2<f32>, x: f32, y: f32) -> vec4<f32> {
    return textureSampleLevel(t, s_lin, vec2<f32>(x, y) / dims, 0.0);
}

// The luma (or packed RGB) plane at continuous coordinates.
fn sample_luma(x: f32, y: f32) -> vec4<f32> {
    if (LUMA_EXACT) {
        let dims = vec2<i32>(P.misc.xy);
        let i = clamp(vec2<i32>(floor(vec2<f32>(x, y) - 0.5)), vec2<i32>(0), dims - 1);
        return textureLoad(t_luma, i, 0);
    }
    return sample_tex(t_luma, P.misc.xy, x, y);
}

// Samples the source at continuous luma coordinates (sx, sy). With crop_clamp
// the coordinates are clamped per plane to the texel centres of the crop
// (the crop shrunk by half a texel, so the filter reads nothing outside it);
// otherwise the sampler wraps x and clamps y (equirect).
fn sample_src(sx: f32, sy: f32, crop_clamp: bool) -> vec4<f32> {
    var lx = sx;
    var ly = sy;
    if (crop_clamp) {
        lx = clamp_axis(sx, P.crop.x, P.crop.x + P.crop.z);
        ly = clamp_axis(sy, P.crop.y, P.crop.y + P.crop.w);
    }
    if (SRC_MODE == 0u) {
        return sample_luma(lx, ly);
    }
    let y = sample_luma(lx, ly).r;
    var cx = sx * 0.5;
    var cy = sy * 0.5;
    if (crop_clamp) {
        cx = clamp_axis(cx, P.crop.x * 0.5, (P.crop.x + P.crop.z) * 0.5);
        cy = clamp_axis(cy, P.crop.y * 0.5, (P.crop.y + P.crop.w) * 0.5);
    }
    let cdims = P.misc.xy * 0.5;
    var u: f32;
    var v: f32;
    if (SRC_MODE == 1u) {
        // NV12: both chroma components in one sample of the RG8 plane.
        let uv = sample_tex(t_c0, cdims, cx, cy);
        u = uv.r;
        v = uv.g;
    } else {
        u = sample_tex(t_c0, cdims, cx, cy).r;
        v = sample_tex(t_c1, cdims, cx, cy).r;
    }
    return vec4<f32>(yuv_to_rgb(y, u, v), 1.0);
}

// Source coordinate of target pixel centre (px, py) for a layer.
fn layer_coord(px: f32, py: f32) -> vec2<f32> {
    let rx = px - P.dst_rect.x;
    let ry = py - P.dst_rect.y;
    return vec2<f32>(
        P.map_b.x + P.map_m.x * rx + P.map_m.y * ry,
        P.map_b.y + P.map_m.z * rx + P.map_m.w * ry,
    );
}

// An identity layer (IDENT) at target pixel centre (px, py).
fn sample_ident(px: f32, py: f32) -> vec4<f32> {
    let l = textureLoad(t_luma, vec2<i32>(vec2<f32>(px, py)), 0);
    if (SRC_MODE == 0u) {
        return l;
    }
    let c = vec2<f32>(px, py) / P.misc.xy;
    let c0 = textureSampleLevel(t_c0, s_lin, c, 0.0);
    if (SRC_MODE == 1u) {
        return vec4<f32>(yuv_to_rgb(l.r, c0.r, c0.g), 1.0);
    }
    let v = textureSampleLevel(t_c1, s_lin, c, 0.0).r;
    return vec4<f32>(yuv_to_rgb(l.r, c0.r, v), 1.0);
}

// The layer's colour at target pixel centre (px, py), before plane alpha.
fn layer_color(px: f32, py: f32) -> vec4<f32> {
    if (IDENT) {
        return sample_ident(px, py);
    }
    let sc = layer_coord(px, py);
    return sample_src(sc.x, sc.y, true);
}

// Source coordinate of target pixel centre (px, py) in the equirect projection.
fn equirect_coord(px: f32, py: f32) -> vec2<f32> {
    let tw = P.target_size.x;
    let th = P.target_size.y;
    let tan_half = P.misc.w;
    let aspect = tw / th;
    let x = (2.0 * px / tw - 1.0) * tan_half * aspect;
    let y = (1.0 - 2.0 * py / th) * tan_half;
    let z = 1.0;
    let y1 = y * P.rot.z + z * P.rot.w;
    let z1 = -y * P.rot.w + z * P.rot.z;
    let x2 = x * P.rot.x + z1 * P.rot.y;
    let z2 = -x * P.rot.y + z1 * P.rot.x;
    let lon = atan2(x2, z2);
    let lat = atan2(y1, sqrt(x2 * x2 + z2 * z2));
    let u = lon / 6.2831853 + 0.5;
    let v = 0.5 - lat / 3.14159265;
    return vec2<f32>(u * P.misc.x, v * P.misc.y);
}
