//! Tests of the precision rewriter: what it replaces and what it leaves, line numbers,
//! where the defaults go, its bound; and, on the host's driver, that rewritten GLSL ES 1.00
//! and 3.00 shaders of both stages compile and report errors at the guest's lines.

use super::*;
use virtsoc_sync::LockExt;

fn hi(src: &str) -> String {
    String::from_utf8(to_highp(src.as_bytes()).into_owned()).expect("utf-8")
}

/// `src` rewritten, the defaults taken out (where they went is tested on its own).
fn hi_bare(src: &str) -> String {
    hi(src).replacen(DEFAULTS, "", 1)
}

#[test]
fn settings_parse_and_resolve_by_renderer() {
    assert_eq!(Precision::parse("guest"), Some(Precision::Guest));
    assert_eq!(Precision::parse(" highp\n"), Some(Precision::Highp));
    assert_eq!(Precision::parse("auto"), Some(Precision::Auto));
    assert_eq!(Precision::parse(""), Some(Precision::Auto));
    assert_eq!(Precision::parse("mediump"), None);
    let llvmpipe = "llvmpipe (LLVM 15.0.6, 256 bits)";
    assert_eq!(Precision::Auto.resolve(llvmpipe), Precision::Highp);
    assert_eq!(Precision::Auto.resolve("softpipe"), Precision::Highp);
    assert_eq!(
        Precision::Auto.resolve("zink (llvmpipe (LLVM 15.0.6, 256 bits))"),
        Precision::Highp
    );
    assert_eq!(
        Precision::Auto.resolve("Mali-G78 r0p1"),
        Precision::Guest,
        "a GPU keeps the guest's precisions"
    );
    assert_eq!(Precision::Auto.resolve(""), Precision::Guest);
    assert_eq!(Precision::Guest.resolve(llvmpipe), Precision::Guest);
    assert_eq!(Precision::Highp.resolve("Mali"), Precision::Highp);
}

#[test]
fn qualifiers_in_code_become_highp_and_keep_columns() {
    let src = "precision mediump float;\nuniform lowp vec4 c;\nvarying mediump vec2 t;\n";
    assert_eq!(
        hi_bare(src),
        "precision highp   float;\nuniform highp vec4 c;\nvarying highp   vec2 t;\n"
    );
    // Struct members, parameters, locals, precision statements in blocks.
    let src = "struct S { mediump float a; lowp int b; };\n\
               mediump float f(in lowp float x, out mediump vec3 y) {\n\
               { precision lowp float; lowp float z = x; y = vec3(z); }\n\
               return x; }\n";
    let out = hi_bare(src);
    assert!(!out.contains("mediump") && !out.contains("lowp"), "{out}");
    assert_eq!(out.matches("highp").count(), 7, "{out}");
    assert!(out.contains("struct S { highp   float a; highp int b; };"));
    assert!(out.contains("{ precision highp float; highp float z = x;"));
}

#[test]
fn es3_layouts_and_blocks() {
    let src = "#version 300 es\n\
               layout(location = 0) in mediump vec4 pos;\n\
               layout(std140) uniform U { lowp vec4 tint; mediump mat4 m; } u;\n\
               flat out mediump int id;\n\
               layout(location = 1) out lowp vec4 color;\n\
               void main() { gl_Position = u.m * pos; id = 1; color = u.tint; }\n";
    let out = hi(src);
    assert!(
        out.starts_with(&format!(
            "#version 300 es\n{DEFAULTS}layout(location = 0) in highp   vec4 pos;\n"
        )),
        "{out}"
    );
    assert!(out.contains("uniform U { highp vec4 tint; highp   mat4 m; } u;"));
    assert!(out.contains("flat out highp   int id;"));
    assert!(out.contains("out highp vec4 color;"));
}

#[test]
fn identifiers_and_numbers_that_contain_the_words_stay() {
    let src = "float mediump_scale; vec2 lowp2; float my_lowp; int mediumpx; float _mediump;\n\
               float a = 1.0e5; float b = .5; int c = 0x1F; uint d = 7u;\n";
    assert_eq!(hi_bare(src), src);
}

#[test]
fn comments_strings_and_other_directives_stay() {
    let src = "// mediump in a line comment\n\
               /* lowp and\n mediump in a block */\n\
               #pragma mediump\n\
               #error lowp \"mediump\"\n\
               #line 10\n\
               #extension GL_OES_standard_derivatives : enable // lowp\n\
               precision mediump float; // mediump\n";
    let out = hi(src);
    assert_eq!(out.matches("highp").count(), 1 + 3, "{out}");
    assert!(out.contains("// mediump in a line comment\n/* lowp and\n mediump in a block */"));
    assert!(out.contains("#pragma mediump\n#error lowp \"mediump\"\n"));
    assert!(out.contains("precision highp   float; // mediump\n"));
    // A comment that never closes runs to the end.
    assert_eq!(hi_bare("/* lowp"), "/* lowp");
}

#[test]
fn define_bodies_are_rewritten() {
    let src = "#define P mediump\n#define V(x) lowp vec4 x\n#define ONE 1.0\nuniform P float a;\n";
    assert_eq!(
        hi_bare(src),
        "#define P highp  \n#define V(x) highp vec4 x\n#define ONE 1.0\nuniform P float a;\n"
    );
    // A continued #define: its next line is still the directive's, then code again.
    let src = "#define Q \\\n  lowp\nlowp float b;\n";
    assert_eq!(hi_bare(src), "#define Q \\\n  highp\nhighp float b;\n");
    // An #if line is left alone (a qualifier there means nothing; none is replaced).
    assert_eq!(hi_bare("#if lowp\n#endif\n"), "#if lowp\n#endif\n");
}

#[test]
fn defaults_go_before_the_first_declaration_outside_conditionals() {
    // glmark2's preamble: the guest's default inside #ifdef GL_ES, then the shader.
    let src =
        "#ifdef GL_ES\nprecision mediump float;\n#endif\nvarying vec4 Color;\nvoid main() {}\n";
    assert_eq!(
        hi(src),
        format!(
            "#ifdef GL_ES\nprecision highp   float;\n#endif\n{DEFAULTS}varying vec4 Color;\nvoid main() {{}}\n"
        )
    );
    // After #version and the leading #extension lines, comments left where they are.
    let src = "#version 100\n// a shader\n#extension GL_OES_standard_derivatives : enable\n  /* x */ varying vec2 t;\n";
    assert_eq!(
        hi(src),
        format!("#version 100\n// a shader\n#extension GL_OES_standard_derivatives : enable\n  /* x */ {DEFAULTS}varying vec2 t;\n")
    );
    // Nested conditionals: only once every block has closed.
    let src = "#if 1\n#ifdef A\nint a;\n#else\nint b;\n#endif\nint c;\n#endif\nint d;\n";
    assert_eq!(
        hi(src),
        format!(
            "#if 1\n#ifdef A\nint a;\n#else\nint b;\n#endif\nint c;\n#endif\n{DEFAULTS}int d;\n"
        )
    );
    // Nothing outside a conditional, no qualifier: the guest's text, borrowed.
    let src = b"#version 100\n#ifdef X\nvoid main() {}\n#endif\n// end\n";
    assert!(matches!(to_highp(src), Cow::Borrowed(_)));
    assert!(matches!(to_highp(b""), Cow::Borrowed(_)));
}

#[test]
fn crlf_sources_and_continued_directives() {
    let src = "#define P \\\r\n lowp\r\nmediump float x;\r\n";
    assert_eq!(
        hi_bare(src),
        "#define P \\\r\n highp\r\nhighp   float x;\r\n"
    );
}

/// A small deterministic generator of GLSL-like text (no dependency for a fuzz loop).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    const PIECES: [&str; 22] = [
        "lowp",
        "mediump",
        "highp",
        " ",
        "\n",
        "\r\n",
        "#",
        "#define ",
        "#if 1",
        "#endif",
        "/*",
        "*/",
        "//",
        "\\",
        "\"",
        "float",
        "1.5e3",
        "x_lowp",
        ";",
        "{",
        "precision ",
        "\t",
    ];
    let mut s = seed | 1;
    let mut out = Vec::new();
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let p = PIECES[(s % PIECES.len() as u64) as usize];
        out.extend_from_slice(p.as_bytes());
        if s % 97 == 0 {
            out.push((s >> 8) as u8); // any byte at all
        }
    }
    out
}

#[test]
fn line_numbers_are_kept_and_the_bound_holds_on_any_input() {
    for seed in 0..2000u64 {
        let src = noise(seed, (seed % 200) as usize);
        let out = to_highp(&src);
        assert!(
            out.len() <= bound(src.len()),
            "seed {seed}: {} > bound",
            out.len()
        );
        let lines = |b: &[u8]| b.iter().filter(|&&c| c == b'\n').count();
        assert_eq!(
            lines(&out),
            lines(&src),
            "seed {seed}: a line added or lost"
        );
        // Every line of the output is its input line with qualifiers replaced (and the
        // defaults inserted once).
        let strip = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .replacen(DEFAULTS, "", 1)
                .replace("mediump", "highp  ")
                .replace("lowp", "highp")
        };
        for (a, b) in out.split(|&c| c == b'\n').zip(src.split(|&c| c == b'\n')) {
            assert_eq!(
                strip(a).replace("highp  ", "highp"),
                strip(b).replace("highp  ", "highp"),
                "seed {seed}"
            );
        }
    }
    // A source of nothing but `lowp`s grows most.
    let worst = "lowp ".repeat(1000);
    assert!(to_highp(worst.as_bytes()).len() <= bound(worst.len()));
    let worst = "lowp;".repeat(1000) + "lowp";
    assert!(to_highp(worst.as_bytes()).len() <= bound(worst.len()));
}

/// Host GL: compiles shaders and reads their logs, on a context of its own.
mod host {
    use std::ffi::c_char;

    use super::*;
    use crate::egl::HostEgl;

    /// Compiles `src` as a shader of `kind`: its status and log.
    fn compile(gl: &Gl, kind: u32, src: &[u8]) -> (bool, String) {
        let mut ok = 0;
        let mut log = vec![0u8; 4096];
        let len = src.len() as i32;
        let ptr = src.as_ptr().cast::<c_char>();
        // SAFETY: a current context (the caller's); one source of `len` bytes; the log
        // buffer has room for 4096 bytes.
        unsafe {
            let s = (gl.glCreateShader)(kind);
            (gl.glShaderSource)(s, 1, &ptr, &len);
            (gl.glCompileShader)(s);
            (gl.glGetShaderiv)(s, 0x8B81, &mut ok);
            let mut n = 0;
            (gl.glGetShaderInfoLog)(s, 4096, &mut n, log.as_mut_ptr().cast());
            (gl.glDeleteShader)(s);
            log.truncate(n.clamp(0, 4096) as usize);
        }
        (ok == 1, String::from_utf8_lossy(&log).into_owned())
    }

    const VS_100: &str = "#version 100\n\
        attribute mediump vec4 pos;\nuniform lowp vec4 tint;\nvarying lowp vec4 c;\n\
        struct L { mediump vec3 dir; lowp float k; };\nuniform L light;\n\
        void main() { c = tint * light.k; gl_Position = pos; }\n";
    const FS_100: &str = "#extension GL_OES_standard_derivatives : enable\n\
        #ifdef GL_ES\nprecision mediump float;\n#endif\n\
        uniform sampler2D t; uniform samplerCube e; uniform int n;\nvarying lowp vec4 c;\n\
        #define Q mediump\n\
        void main() { Q vec4 s = texture2D(t, c.xy) + textureCube(e, c.xyz);\n\
        for (lowp int i = 0; i < 4; i++) { if (i >= n) break; s *= 0.5; }\n\
        gl_FragColor = s * c + vec4(dFdx(c.x)); }\n";
    const VS_300: &str = "#version 300 es\n\
        layout(location = 0) in mediump vec4 pos;\n\
        layout(std140) uniform U { lowp vec4 tint; mediump mat4 m; } u;\n\
        flat out mediump int id;\nout lowp vec4 c;\n\
        void main() { id = gl_VertexID; c = u.tint; gl_Position = u.m * pos; }\n";
    const FS_300: &str = "#version 300 es\nprecision mediump float;\n\
        precision lowp sampler3D;\nuniform sampler3D v; uniform lowp sampler2DArray a;\n\
        flat in mediump int id;\nin lowp vec4 c;\nlayout(location = 0) out lowp vec4 o;\n\
        void main() { o = c + texture(v, c.xyz) + texture(a, c.xyz) * float(id); }\n";

    #[test]
    fn rewritten_shaders_compile_and_errors_keep_their_lines() {
        let _one = crate::egl::HOST_EGL_TESTS.lock_or_recover();
        let Ok(egl) = HostEgl::open() else {
            assert!(
                std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
                "no host EGL"
            );
            eprintln!("SKIPPED: no host EGL");
            return;
        };
        let null = std::ptr::null_mut();
        let Ok(ctx) = egl.create_context(null, null, 3) else {
            eprintln!("SKIPPED: no ES 3 context on the host");
            return;
        };
        egl.make_current(null, null, ctx).expect("current");
        // SAFETY: the loader answers the host's GL functions by name.
        let gl = unsafe { Gl::load(|n| egl.proc_address(n)) }.expect("host GL");
        for (kind, src) in [
            (0x8B31, VS_100),
            (0x8B30, FS_100),
            (0x8B31, VS_300),
            (0x8B30, FS_300),
        ] {
            let (ok, log) = compile(&gl, kind, src.as_bytes());
            assert!(ok, "the guest's shader compiles: {log}\n{src}");
            let out = to_highp(src.as_bytes());
            assert_ne!(&*out, src.as_bytes(), "rewritten");
            let (ok, log) = compile(&gl, kind, &out);
            let text = String::from_utf8_lossy(&out);
            assert!(ok, "the rewritten shader compiles: {log}\n{text}");
            // An error on the guest's last line is reported on that line after the rewrite.
            let bad = format!("{src}lowp float broken = ;\n");
            let line = bad.lines().count();
            let (ok, log_guest) = compile(&gl, kind, bad.as_bytes());
            assert!(!ok);
            let (ok, log_ours) = compile(&gl, kind, &to_highp(bad.as_bytes()));
            assert!(!ok);
            let at = format!("0:{line}(");
            assert!(log_guest.contains(&at), "{at} in {log_guest}");
            assert!(log_ours.contains(&at), "{at} in {log_ours}");
        }
        // A fragment shader without a float precision stays refused (no default float is
        // declared for it).
        let src = "varying vec4 c; void main() { gl_FragColor = c; }\n";
        assert!(!compile(&gl, 0x8B30, src.as_bytes()).0);
        assert!(!compile(&gl, 0x8B30, &to_highp(src.as_bytes())).0);
        egl.make_current(null, null, null).expect("release");
        egl.destroy_context(ctx);
    }
}
